// The element math of a decode step's attention inputs (model_ops.h's DecodeInputs), shared by
// decode_inputs.cu (from the projection in memory) and decode_projection.cu (from the product's
// sums in shared memory): one expression each, so both kernels give the same bits.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "model/cuda/model_ops.h"
#include "model/cuda/pointwise.cuh"

namespace nsa::cuda {

// dst[0], dst[1] = the channel pair (x0, x1) rotated by the angle of (fc, fs), in bf16.
__device__ inline void store_rotated_pair(float x0, float x1, float fc, float fs,
                                          __nv_bfloat16* dst) {
  const float2 r = rope_rotate(x0, x1, fc, fs);
  dst[0] = __float2bfloat16(r.x);
  dst[1] = __float2bfloat16(r.y);
}

// Head h of sequence b: its gates from its three logits with the bias added (v, overwritten),
// zero for a disabled branch.
__device__ inline void store_head_gates(float v[3], const DecodeInputs& in, int64_t b, int64_t h) {
  gate_values(v, in.softmax);
  for (int c = 0; c < 3; ++c)
    in.gate[c][b * in.H + h] = __float2bfloat16(in.enabled[c] ? v[c] : 0.0f);
}

}  // namespace nsa::cuda
