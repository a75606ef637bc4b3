// RMSNorm forward and backward on the GPU, one CTA per row (see model_ops.h).
#include "cuda/common/block_reduce.cuh"
#include "cuda/common/cuda_check.h"
#include "model/cuda/model_ops.h"

namespace nsa::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void rmsnorm_forward_kernel(const float* __restrict__ x, const float* __restrict__ w,
                                       float eps, bf16* __restrict__ y, float* __restrict__ rstd,
                                       int64_t D) {
  __shared__ float scratch[33];
  const int64_t t = blockIdx.x;
  const float* xr = x + t * D;
  float ss = 0.0f;
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) ss += xr[j] * xr[j];
  ss = block_sum(ss, scratch);
  const float r = rsqrtf(ss / static_cast<float>(D) + eps);
  if (threadIdx.x == 0) rstd[t] = r;
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x)
    y[t * D + j] = __float2bfloat16(xr[j] * r * w[j]);
}

// dx (+)= r·(dy∘w − x̂·mean(dy∘w∘x̂)); also writes dy∘x̂ into `dyxhat` for the weight gradient.
__global__ void rmsnorm_backward_kernel(const float* __restrict__ x, const float* __restrict__ w,
                                        const float* __restrict__ rstd,
                                        const float* __restrict__ dy, float* __restrict__ dx,
                                        bool accumulate, float* __restrict__ dyxhat, int64_t D) {
  __shared__ float scratch[33];
  const int64_t t = blockIdx.x;
  const float r = rstd[t];
  const float* xr = x + t * D;
  const float* dyr = dy + t * D;
  float dot = 0.0f;
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) dot += dyr[j] * w[j] * xr[j] * r;
  dot = block_sum(dot, scratch) / static_cast<float>(D);
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
    const float xhat = xr[j] * r;
    const float g = r * (dyr[j] * w[j] - xhat * dot);
    dx[t * D + j] = accumulate ? dx[t * D + j] + g : g;
    dyxhat[t * D + j] = dyr[j] * xhat;
  }
}

}  // namespace

void launch_rmsnorm_forward(const float* x, const float* w, float eps, bf16* y, float* rstd,
                            int64_t T, int64_t D, cudaStream_t stream) {
  if (T == 0) return;
  rmsnorm_forward_kernel<<<static_cast<unsigned>(T), kThreads, 0, stream>>>(x, w, eps, y, rstd, D);
  NSA_CUDA_LAUNCH_CHECK();
}

void launch_rmsnorm_backward(const float* x, const float* w, const float* rstd, const float* dy,
                             float* dx, bool accumulate_dx, float* dw, float* partial, int64_t T,
                             int64_t D, cudaStream_t stream) {
  if (T == 0) return;
  // partial holds T·D floats of dy∘x̂ followed by the column-sum chunks.
  float* dyxhat = partial;
  rmsnorm_backward_kernel<<<static_cast<unsigned>(T), kThreads, 0, stream>>>(
      x, w, rstd, dy, dx, accumulate_dx, dyxhat, D);
  NSA_CUDA_LAUNCH_CHECK();
  launch_column_sum_accumulate(dyxhat, T, D, partial + T * D, dw, stream);
}

}  // namespace nsa::cuda
