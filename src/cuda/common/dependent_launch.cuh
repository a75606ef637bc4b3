// Programmatic dependent launch (Hopper): a chain of small dependent kernels – the decode step's –
// costs a launch gap at every boundary. Launched with launch_dependent, a kernel's CTAs may be
// scheduled while the kernel before it still runs; each such kernel starts with
// wait_for_previous_kernel(), which lets the next kernel launch and then blocks until the
// previous one has finished and its writes are visible. Nothing may be read or written before
// that call, so the order of the stream is kept exactly.
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include "cuda_check.h"

namespace nsa::cuda {

__device__ __forceinline__ void wait_for_previous_kernel() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;");
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

template <typename... Params, typename... Args>
void launch_dependent(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                      cudaStream_t stream, Args&&... args) {
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  config.attrs = &attr;
  config.numAttrs = 1;
  NSA_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...));
  NSA_CUDA_LAUNCH_CHECK();
}

}  // namespace nsa::cuda
