// Element-wise fp32 → bf16 conversion on the device (round to nearest even).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace nsa::cuda {

void launch_f32_to_bf16(const float* src, __nv_bfloat16* dst, int64_t n, cudaStream_t stream);
// src [rows, cols] (contiguous) → the rows of dst, dst_ld elements apart (a column block of a wider
// matrix).
void launch_f32_to_bf16_rows(const float* src, int64_t rows, int64_t cols, __nv_bfloat16* dst,
                             int64_t dst_ld, cudaStream_t stream);

// Up to kMax separate conversions in one launch (a kernel each would cost a launch each); four
// elements per thread where src is 16-byte and dst 8-byte aligned, one otherwise.
struct F32ToBf16Batch {
  static constexpr int kMax = 8;
  int n = 0;
  const float* src[kMax] = {};
  __nv_bfloat16* dst[kMax] = {};
  int64_t count[kMax] = {};
  // Adds one conversion (throws past kMax); a null or empty one is skipped.
  void add(const float* s, __nv_bfloat16* d, int64_t elements);
};
void launch_f32_to_bf16_batch(const F32ToBf16Batch& batch, cudaStream_t stream);

}  // namespace nsa::cuda
