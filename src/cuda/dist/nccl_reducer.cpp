// The NCCL gradient all-reduce (see nccl_reducer.h).
#include "nccl_reducer.h"

#include <nccl.h>

#include "nsa/error.h"

namespace nsa::cuda {
namespace {

void check(ncclResult_t rc, const char* what) {
  NSA_CHECK(rc == ncclSuccess, "NCCL ", what, " failed: ", ncclGetErrorString(rc),
            " (set NCCL_DEBUG=INFO for NCCL's own account)");
}

}  // namespace

NcclReducer::NcclReducer(Communicator& host) {
  ncclUniqueId id{};
  if (host.rank() == 0) check(ncclGetUniqueId(&id), "ncclGetUniqueId");
  host.broadcast(&id, sizeof id);
  ncclComm_t comm = nullptr;
  check(ncclCommInitRank(&comm, host.world(), id, host.rank()), "ncclCommInitRank");
  comm_ = comm;
}

NcclReducer::~NcclReducer() {
  if (comm_) ncclCommDestroy(static_cast<ncclComm_t>(comm_));
}

void NcclReducer::allreduce_sum(float* data, int64_t n, cudaStream_t stream) {
  check(ncclAllReduce(data, data, static_cast<size_t>(n), ncclFloat, ncclSum,
                      static_cast<ncclComm_t>(comm_), stream),
        "ncclAllReduce");
}

}  // namespace nsa::cuda
