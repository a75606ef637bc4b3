// Dynamic shared memory beyond the default 48 KiB needs a per-kernel opt-in. One helper for every
// launcher that asks for more: it raises the kernel's limit to at least `bytes` and never lowers
// it, so launches of other shapes (other decoders, other widths) that needed more still fit. The
// limit without the opt-in is 48 KiB less the kernel's static shared memory, so every request is
// checked against the kernel's attributes (a host query, no device work).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "cuda_check.h"

namespace nsa::cuda {

template <typename Kernel>
void allow_dynamic_smem(Kernel kernel, size_t bytes) {
  cudaFuncAttributes attr{};
  NSA_CUDA_CHECK(cudaFuncGetAttributes(&attr, kernel));
  if (static_cast<size_t>(attr.maxDynamicSharedSizeBytes) < bytes) {
    NSA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(bytes)));
  }
}

}  // namespace nsa::cuda
