// RMSNorm forward and backward on the GPU, one CTA per row (see model_ops.h). The row reductions
// (sum of squares, the backward's dot product) keep one fixed order – thread j sums channels j,
// j + blockDim, … – so their bits never change; the element-wise pass after each reads and
// writes four channels per thread (128-bit fp32 loads, 64-bit bf16 stores) when D % 4 == 0 and
// the pointers are aligned, one otherwise, through the same inline math.
#include "cuda/common/block_reduce.cuh"
#include "cuda/common/cuda_check.h"
#include "model/cuda/model_ops.h"
#include "model/cuda/vec_access.cuh"

namespace nsa::cuda {
namespace {

constexpr int kThreads = 256;

__device__ inline float normed(float x, float r, float w) {
  return x * r * w;
}

// g = r·(dy·w − x̂·dot), x̂ = x·r; dyx = dy·x̂ (the weight gradient's term).
__device__ inline void rms_grad(float x, float dy, float w, float r, float dot, float& g,
                                float& dyx) {
  const float xhat = x * r;
  g = r * (dy * w - xhat * dot);
  dyx = dy * xhat;
}

template <int kVec>
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
  bf16* yr = y + t * D;
  for (int64_t j = threadIdx.x * kVec; j < D; j += static_cast<int64_t>(blockDim.x) * kVec) {
    if constexpr (kVec == 4) {
      const float4 xv = *reinterpret_cast<const float4*>(xr + j);
      const float4 wv = *reinterpret_cast<const float4*>(w + j);
      store_bf16x4(yr + j, normed(xv.x, r, wv.x), normed(xv.y, r, wv.y), normed(xv.z, r, wv.z),
                   normed(xv.w, r, wv.w));
    } else {
      yr[j] = __float2bfloat16(normed(xr[j], r, w[j]));
    }
  }
}

// dx (+)= g and, when asked, its bf16 copy; dyxhat = dy·x̂ for the weight gradient.
template <int kVec>
__global__ void rmsnorm_backward_kernel(const float* __restrict__ x, const float* __restrict__ w,
                                        const float* __restrict__ rstd,
                                        const float* __restrict__ dy, float* __restrict__ dx,
                                        bool accumulate, bf16* __restrict__ dx_bf16,
                                        float* __restrict__ dyxhat, int64_t D) {
  __shared__ float scratch[33];
  const int64_t t = blockIdx.x;
  const float r = rstd[t];
  const float* xr = x + t * D;
  const float* dyr = dy + t * D;
  float dot = 0.0f;
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) dot += dyr[j] * w[j] * xr[j] * r;
  dot = block_sum(dot, scratch) / static_cast<float>(D);
  float* dxr = dx + t * D;
  float* dyxr = dyxhat + t * D;
  for (int64_t j = threadIdx.x * kVec; j < D; j += static_cast<int64_t>(blockDim.x) * kVec) {
    if constexpr (kVec == 4) {
      const float4 xv = *reinterpret_cast<const float4*>(xr + j);
      const float4 dv = *reinterpret_cast<const float4*>(dyr + j);
      const float4 wv = *reinterpret_cast<const float4*>(w + j);
      float4 g, dyx;
      rms_grad(xv.x, dv.x, wv.x, r, dot, g.x, dyx.x);
      rms_grad(xv.y, dv.y, wv.y, r, dot, g.y, dyx.y);
      rms_grad(xv.z, dv.z, wv.z, r, dot, g.z, dyx.z);
      rms_grad(xv.w, dv.w, wv.w, r, dot, g.w, dyx.w);
      if (accumulate) {
        const float4 old = *reinterpret_cast<const float4*>(dxr + j);
        g.x = old.x + g.x, g.y = old.y + g.y, g.z = old.z + g.z, g.w = old.w + g.w;
      }
      *reinterpret_cast<float4*>(dxr + j) = g;
      *reinterpret_cast<float4*>(dyxr + j) = dyx;
      if (dx_bf16) store_bf16x4(dx_bf16 + t * D + j, g.x, g.y, g.z, g.w);
    } else {
      float g, dyx;
      rms_grad(xr[j], dyr[j], w[j], r, dot, g, dyx);
      if (accumulate) g = dxr[j] + g;
      dxr[j] = g;
      dyxr[j] = dyx;
      if (dx_bf16) dx_bf16[t * D + j] = __float2bfloat16(g);
    }
  }
}

}  // namespace

void launch_rmsnorm_forward(const float* x, const float* w, float eps, bf16* y, float* rstd,
                            int64_t T, int64_t D, cudaStream_t stream) {
  if (T == 0) return;
  if (D % 4 == 0 && aligned_for(16, x, w) && aligned_for(8, y)) {
    rmsnorm_forward_kernel<4>
        <<<static_cast<unsigned>(T), kThreads, 0, stream>>>(x, w, eps, y, rstd, D);
  } else {
    rmsnorm_forward_kernel<1>
        <<<static_cast<unsigned>(T), kThreads, 0, stream>>>(x, w, eps, y, rstd, D);
  }
  NSA_CUDA_LAUNCH_CHECK();
}

void launch_rmsnorm_backward(const float* x, const float* w, const float* rstd, const float* dy,
                             float* dx, bool accumulate_dx, bf16* dx_bf16, float* dw,
                             float* partial, int64_t T, int64_t D, cudaStream_t stream) {
  if (T == 0) return;
  // partial holds T·D floats of dy∘x̂ followed by the column-sum chunks.
  float* dyxhat = partial;
  if (D % 4 == 0 && aligned_for(16, x, w, dy, dx, dyxhat) && aligned_for(8, dx_bf16)) {
    rmsnorm_backward_kernel<4><<<static_cast<unsigned>(T), kThreads, 0, stream>>>(
        x, w, rstd, dy, dx, accumulate_dx, dx_bf16, dyxhat, D);
  } else {
    rmsnorm_backward_kernel<1><<<static_cast<unsigned>(T), kThreads, 0, stream>>>(
        x, w, rstd, dy, dx, accumulate_dx, dx_bf16, dyxhat, D);
  }
  NSA_CUDA_LAUNCH_CHECK();
  launch_column_sum_accumulate(dyxhat, T, D, partial + T * D, dw, stream);
}

}  // namespace nsa::cuda
