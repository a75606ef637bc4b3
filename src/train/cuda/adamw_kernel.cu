// AdamW on the GPU (see adamw_kernel.h): the update of train/adamw.h on fp32 master weights and
// moments, writing the bf16 copy the GEMMs read.
#include "adamw_kernel.h"

#include "cuda/common/cuda_check.h"

namespace nsa::cuda {
namespace {

using bf16 = __nv_bfloat16;

__global__ void adamw_kernel(float* __restrict__ p, bf16* __restrict__ p_bf16,
                             const float* __restrict__ g, float* __restrict__ m,
                             float* __restrict__ v, int64_t n, AdamWScalars s) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float gi = g[i] * s.g_scale;
  const float mi = s.beta1 * m[i] + (1 - s.beta1) * gi;
  const float vi = s.beta2 * v[i] + (1 - s.beta2) * gi * gi;
  m[i] = mi;
  v[i] = vi;
  const float mhat = mi / s.bc1, vhat = vi / s.bc2;
  const float pi = p[i] - s.lr * (mhat / (sqrtf(vhat) + s.eps) + s.weight_decay * p[i]);
  p[i] = pi;
  p_bf16[i] = __float2bfloat16(pi);
}

}  // namespace

void launch_adamw(float* p, __nv_bfloat16* p_bf16, const float* g, float* m, float* v, int64_t n,
                  const AdamWScalars& s, cudaStream_t stream) {
  if (n == 0) return;
  adamw_kernel<<<static_cast<unsigned>((n + 255) / 256), 256, 0, stream>>>(p, p_bf16, g, m, v, n,
                                                                           s);
  NSA_CUDA_LAUNCH_CHECK();
}

}  // namespace nsa::cuda
