// 128-bit (and 64-bit) loads and stores for the model's element-wise kernels: 4 floats or 8 bf16
// per access instead of one, where the pointers allow it (aligned_for), with a scalar path for
// the rest. The kernels compute each element with the same inline function on both paths, so the
// vector path's bits are the scalar path's (tests/cuda/test_model_ops_cuda.cpp).
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

namespace nsa::cuda {

// Host side: every pointer a multiple of `bytes` (16 for 4 floats / 8 bf16, 8 for 4 bf16).
template <typename... Ptr>
inline bool aligned_for(int bytes, const Ptr*... p) {
  return ((reinterpret_cast<uintptr_t>(p) % static_cast<uintptr_t>(bytes) == 0) && ...);
}

// 8 bf16 ↔ 8 floats through one 16-byte access.
__device__ __forceinline__ void unpack_bf16x8(const uint4& raw, float out[8]) {
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const float2 f = __bfloat1622float2(h[k]);
    out[2 * k] = f.x, out[2 * k + 1] = f.y;
  }
}
__device__ inline void load_bf16x8(const __nv_bfloat16* p, float out[8]) {
  unpack_bf16x8(*reinterpret_cast<const uint4*>(p), out);
}
__device__ inline void store_bf16x8(__nv_bfloat16* p, const float in[8]) {
  uint4 raw;
  __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&raw);
  for (int k = 0; k < 4; ++k) h[k] = __floats2bfloat162_rn(in[2 * k], in[2 * k + 1]);
  *reinterpret_cast<uint4*>(p) = raw;
}
// 4 floats → 4 bf16 through one 8-byte store.
__device__ inline void store_bf16x4(__nv_bfloat16* p, float a, float b, float c, float d) {
  uint2 raw;
  __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&raw);
  h[0] = __floats2bfloat162_rn(a, b);
  h[1] = __floats2bfloat162_rn(c, d);
  *reinterpret_cast<uint2*>(p) = raw;
}
// kReadOnly: through the read-only data cache (__ldg) – only for memory no thread of the kernel
// writes.
template <bool kReadOnly = false>
__device__ inline void load_f32x8(const float* p, float out[8]) {
  const float4* q = reinterpret_cast<const float4*>(p);
  const float4 a = kReadOnly ? __ldg(q) : q[0];
  const float4 b = kReadOnly ? __ldg(q + 1) : q[1];
  out[0] = a.x, out[1] = a.y, out[2] = a.z, out[3] = a.w;
  out[4] = b.x, out[5] = b.y, out[6] = b.z, out[7] = b.w;
}

}  // namespace nsa::cuda
