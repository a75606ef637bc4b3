// SwiGLU / SiLU MLP activation on the GPU (see model_ops.h), element-wise in fp32. Eight elements
// per thread through 128-bit loads and stores when every pointer is 16-byte aligned (a model's
// buffers are), one otherwise; each element goes through the same inline math either way.
#include "cuda/common/cuda_check.h"
#include "model/cuda/model_ops.h"
#include "model/cuda/pointwise.cuh"
#include "model/cuda/vec_access.cuh"

namespace nsa::cuda {
namespace {

constexpr int kThreads = 256;

// u3 absent (SiLU): b = 1 and no du3. swiglu_value (pointwise.cuh) is m's arithmetic.
__device__ inline void swiglu_grads(float a, float b, float dm, float& da, float& db) {
  const float s = 1.0f / (1.0f + expf(-a));
  da = dm * b * s * (1.0f + a * (1.0f - s));
  db = dm * a * s;
}

template <int kVec>
__global__ void swiglu_forward_kernel(const bf16* __restrict__ u1, const bf16* __restrict__ u3,
                                      bf16* __restrict__ m, int64_t n) {
  const int64_t i0 = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * kVec;
  if (i0 >= n) return;
  if (kVec == 8 && i0 + 8 <= n) {
    float a[8], b[8] = {1, 1, 1, 1, 1, 1, 1, 1}, out[8];
    load_bf16x8(u1 + i0, a);
    if (u3) load_bf16x8(u3 + i0, b);
    for (int k = 0; k < 8; ++k) out[k] = u3 ? swiglu_value(a[k], b[k]) : swiglu_value(a[k], 1.0f);
    store_bf16x8(m + i0, out);
    return;
  }
  for (int64_t i = i0; i < n && i < i0 + kVec; ++i) {
    const float a = __bfloat162float(u1[i]);
    m[i] = __float2bfloat16(u3 ? swiglu_value(a, __bfloat162float(u3[i])) : swiglu_value(a, 1.0f));
  }
}

template <int kVec>
__global__ void swiglu_backward_kernel(const bf16* __restrict__ u1, const bf16* __restrict__ u3,
                                       const bf16* __restrict__ dm, bf16* __restrict__ du1,
                                       bf16* __restrict__ du3, bf16* __restrict__ m, int64_t n) {
  const int64_t i0 = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * kVec;
  if (i0 >= n) return;
  if (kVec == 8 && i0 + 8 <= n) {
    float a[8], b[8] = {1, 1, 1, 1, 1, 1, 1, 1}, g[8], da[8], db[8];
    load_bf16x8(u1 + i0, a);
    if (u3) load_bf16x8(u3 + i0, b);
    load_bf16x8(dm + i0, g);
    for (int k = 0; k < 8; ++k) swiglu_grads(a[k], u3 ? b[k] : 1.0f, g[k], da[k], db[k]);
    store_bf16x8(du1 + i0, da);
    if (u3) store_bf16x8(du3 + i0, db);
    if (m) {
      float out[8];
      for (int k = 0; k < 8; ++k) out[k] = u3 ? swiglu_value(a[k], b[k]) : swiglu_value(a[k], 1.0f);
      store_bf16x8(m + i0, out);
    }
    return;
  }
  for (int64_t i = i0; i < n && i < i0 + kVec; ++i) {
    float da, db;
    const float a = __bfloat162float(u1[i]);
    swiglu_grads(a, u3 ? __bfloat162float(u3[i]) : 1.0f, __bfloat162float(dm[i]), da, db);
    du1[i] = __float2bfloat16(da);
    if (u3) du3[i] = __float2bfloat16(db);
    if (m) {
      m[i] =
          __float2bfloat16(u3 ? swiglu_value(a, __bfloat162float(u3[i])) : swiglu_value(a, 1.0f));
    }
  }
}

unsigned blocks_for(int64_t n, int vec) {
  return static_cast<unsigned>((n + static_cast<int64_t>(kThreads) * vec - 1) /
                               (static_cast<int64_t>(kThreads) * vec));
}

}  // namespace

void launch_swiglu_forward(const bf16* u1, const bf16* u3, bf16* m, int64_t n,
                           cudaStream_t stream) {
  if (n == 0) return;
  if (aligned_for(16, u1, u3, m)) {  // a null u3 counts as aligned
    swiglu_forward_kernel<8><<<blocks_for(n, 8), kThreads, 0, stream>>>(u1, u3, m, n);
  } else {
    swiglu_forward_kernel<1><<<blocks_for(n, 1), kThreads, 0, stream>>>(u1, u3, m, n);
  }
  NSA_CUDA_LAUNCH_CHECK();
}

void launch_swiglu_backward(const bf16* u1, const bf16* u3, const bf16* dm, bf16* du1, bf16* du3,
                            bf16* m, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  if (aligned_for(16, u1, u3, dm, du1, du3, m)) {
    swiglu_backward_kernel<8>
        <<<blocks_for(n, 8), kThreads, 0, stream>>>(u1, u3, dm, du1, du3, m, n);
  } else {
    swiglu_backward_kernel<1>
        <<<blocks_for(n, 1), kThreads, 0, stream>>>(u1, u3, dm, du1, du3, m, n);
  }
  NSA_CUDA_LAUNCH_CHECK();
}

}  // namespace nsa::cuda
