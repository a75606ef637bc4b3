// One error-check macro family for every CUDA runtime call and kernel launch.
//
// NSA_CUDA_CHECK(call) throws nsa::Error naming the call, file and line. NSA_CUDA_LAUNCH_CHECK()
// follows every launch; with NSA_CUDA_SYNC=1 in the environment it also synchronises, so an
// asynchronous fault is reported at the kernel that caused it rather than somewhere later.
#pragma once

#include <cuda_runtime.h>

#include "nsa/error.h"

namespace nsa::cuda {

[[noreturn]] void throw_cuda_error(cudaError_t err, const char* call, const char* file, int line);
// True when NSA_CUDA_SYNC=1 (read once).
bool sync_after_launch();

}  // namespace nsa::cuda

#define NSA_CUDA_CHECK(call)                                              \
  do {                                                                    \
    const cudaError_t nsa_err_ = (call);                                  \
    if (nsa_err_ != cudaSuccess) {                                        \
      ::nsa::cuda::throw_cuda_error(nsa_err_, #call, __FILE__, __LINE__); \
    }                                                                     \
  } while (0)

#define NSA_CUDA_LAUNCH_CHECK()                                                    \
  do {                                                                             \
    NSA_CUDA_CHECK(cudaGetLastError());                                            \
    if (::nsa::cuda::sync_after_launch()) NSA_CUDA_CHECK(cudaDeviceSynchronize()); \
  } while (0)
