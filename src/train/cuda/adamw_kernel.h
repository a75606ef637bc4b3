// The AdamW update kernel (adamw_kernel.cu): one step of train/adamw.h on n elements of fp32
// master weights and moments, writing the bf16 copy the GEMMs read. g is read times g_scale
// (clipping and accumulation).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace nsa::cuda {

struct AdamWScalars {
  float lr, beta1, beta2, bc1, bc2, eps, weight_decay, g_scale;
};
void launch_adamw(float* p, __nv_bfloat16* p_bf16, const float* g, float* m, float* v, int64_t n,
                  const AdamWScalars& s, cudaStream_t stream);

}  // namespace nsa::cuda
