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

}  // namespace nsa::cuda
