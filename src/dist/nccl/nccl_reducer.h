// GPU-to-GPU gradient all-reduce with NCCL for data-parallel training on several GPUs. The ranks
// find each other through the run's host communicator (MPI or TCP, dist/communicator.h): rank 0
// makes the NCCL id and broadcasts it. The sum runs on the model's stream, in place, on the flat
// gradient buffer – no copy through host memory. A rank that dies leaves the others waiting in
// the all-reduce until the trainer's watchdog ends them with a message naming it.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "dist/communicator.h"

namespace nsa::cuda {

class NcclReducer {
 public:
  explicit NcclReducer(Communicator& host);
  ~NcclReducer();
  NcclReducer(const NcclReducer&) = delete;
  NcclReducer& operator=(const NcclReducer&) = delete;
  // data[i] = Σ over ranks (device memory, n floats), queued on `stream`.
  void allreduce_sum(float* data, int64_t n, cudaStream_t stream);

 private:
  void* comm_ = nullptr;  // ncclComm_t
};

}  // namespace nsa::cuda
