// The NCCL gradient all-reduce (see nccl_reducer.h).
#include "nccl_reducer.h"

#include "nccl_check.h"
#include "nsa/error.h"

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

void NcclReducer::allgather_ranges(float* data, const std::vector<int64_t>& offsets,
                                   cudaStream_t stream) {
  int world = 0;
  NSA_NCCL_CHECK(ncclCommCount(static_cast<ncclComm_t>(comm_), &world));
  NSA_CHECK(static_cast<int>(offsets.size()) == world + 1, "allgather_ranges: ", offsets.size(),
            " offsets for ", world, " ranks, expected ", world + 1);
  NSA_NCCL_CHECK(ncclGroupStart());
  for (int r = 0; r < world; ++r) {
    float* part = data + offsets[r];
    NSA_NCCL_CHECK(ncclBroadcast(part, part, static_cast<size_t>(offsets[r + 1] - offsets[r]),
                                 ncclFloat, r, static_cast<ncclComm_t>(comm_), stream));
  }
  NSA_NCCL_CHECK(ncclGroupEnd());
}

}  // namespace nsa::cuda
