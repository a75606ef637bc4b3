// GPU-to-GPU collectives with NCCL for data-parallel training on several GPUs: the gradient
// all-reduce, and ZeRO-1's gather of the updated weight slices. The ranks find each other through
// the run's host communicator (MPI or TCP, dist/communicator.h): rank 0 makes the NCCL id and
// broadcasts it. Both run on the model's stream, in place, on the flat buffers – no copy through
// host memory. A rank that dies leaves the others waiting in a collective until the trainer's
// watchdog ends them with a message naming it.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

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
  // Communicator::allgather_ranges on the device: data [offsets[world]], rank r's part [offsets[r],
  // offsets[r + 1]) goes to every rank (one broadcast per rank in one NCCL group, so the parts may
  // differ in size, as even_ranges' do), queued on `stream`.
  void allgather_ranges(float* data, const std::vector<int64_t>& offsets, cudaStream_t stream);

 private:
  void* comm_ = nullptr;  // ncclComm_t
};

}  // namespace nsa::cuda
