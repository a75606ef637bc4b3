// Deterministic block-wide reductions: warp shuffles, then one warp over the per-warp results, in
// a fixed order, so a sum is bit-identical from run to run. All threads get the result.
#pragma once

#include <cfloat>

namespace nsa::cuda {

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// `scratch` holds at least 33 floats of shared memory; blockDim.x is a multiple of 32.
template <bool kMax>
__device__ __forceinline__ float block_reduce(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = kMax ? warp_max(v) : warp_sum(v);
  __syncthreads();  // scratch may still be read by a previous reduction
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  if (warp == 0) {
    float x = lane < warps ? scratch[lane] : (kMax ? -FLT_MAX : 0.0f);
    x = kMax ? warp_max(x) : warp_sum(x);
    if (lane == 0) scratch[32] = x;
  }
  __syncthreads();
  return scratch[32];
}

__device__ __forceinline__ float block_sum(float v, float* scratch) {
  return block_reduce<false>(v, scratch);
}
__device__ __forceinline__ float block_max(float v, float* scratch) {
  return block_reduce<true>(v, scratch);
}

}  // namespace nsa::cuda
