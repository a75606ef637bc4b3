// SwiGLU / SiLU MLP activation on the GPU (see model_ops.h), element-wise in fp32.
#include "cuda/common/cuda_check.h"
#include "model/cuda/model_ops.h"

namespace nsa::cuda {
namespace {

__global__ void swiglu_forward_kernel(const bf16* __restrict__ u1, const bf16* __restrict__ u3,
                                      bf16* __restrict__ m, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float a = __bfloat162float(u1[i]);
  const float silu = a / (1.0f + expf(-a));
  m[i] = __float2bfloat16(u3 ? silu * __bfloat162float(u3[i]) : silu);
}

__global__ void swiglu_backward_kernel(const bf16* __restrict__ u1, const bf16* __restrict__ u3,
                                       const float* __restrict__ dm, bf16* __restrict__ du1,
                                       bf16* __restrict__ du3, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float a = __bfloat162float(u1[i]);
  const float s = 1.0f / (1.0f + expf(-a));
  const float b = u3 ? __bfloat162float(u3[i]) : 1.0f;
  du1[i] = __float2bfloat16(dm[i] * b * s * (1.0f + a * (1.0f - s)));
  if (u3) du3[i] = __float2bfloat16(dm[i] * a * s);
}

}  // namespace

void launch_swiglu_forward(const bf16* u1, const bf16* u3, bf16* m, int64_t n,
                           cudaStream_t stream) {
  if (n == 0) return;
  swiglu_forward_kernel<<<static_cast<unsigned>((n + 255) / 256), 256, 0, stream>>>(u1, u3, m, n);
  NSA_CUDA_LAUNCH_CHECK();
}

void launch_swiglu_backward(const bf16* u1, const bf16* u3, const float* dm, bf16* du1, bf16* du3,
                            int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  swiglu_backward_kernel<<<static_cast<unsigned>((n + 255) / 256), 256, 0, stream>>>(u1, u3, dm,
                                                                                     du1, du3, n);
  NSA_CUDA_LAUNCH_CHECK();
}

}  // namespace nsa::cuda
