// The NCCL gradient all-reduce (see nccl_reducer.h).
#include "nccl_reducer.h"

#include "nccl_check.h"

namespace nsa::cuda {

NcclReducer::NcclReducer(Communicator& host) {
  ncclUniqueId id{};
  if (host.rank() == 0) NSA_NCCL_CHECK(ncclGetUniqueId(&id));
  host.broadcast(&id, sizeof id);
  ncclComm_t comm = nullptr;
  NSA_NCCL_CHECK(ncclCommInitRank(&comm, host.world(), id, host.rank()));
  comm_ = comm;
}

NcclReducer::~NcclReducer() {
  if (comm_) ncclCommDestroy(static_cast<ncclComm_t>(comm_));
}

void NcclReducer::allreduce_sum(float* data, int64_t n, cudaStream_t stream) {
  NSA_NCCL_CHECK(ncclAllReduce(data, data, static_cast<size_t>(n), ncclFloat, ncclSum,
                               static_cast<ncclComm_t>(comm_), stream));
}

}  // namespace nsa::cuda
