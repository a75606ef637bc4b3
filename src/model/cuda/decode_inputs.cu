// The attention inputs of one decode step from one fused projection (see model_ops.h): a single
// GEMM gives [q | k per branch | v per branch | gate logits] per sequence, and this one kernel
// rotates q and k, converts v and applies the gates – instead of a GEMM and a kernel for each.
#include "cuda/common/cuda_check.h"
#include "model/cuda/model_ops.h"
#include "pointwise.cuh"

namespace nsa::cuda {
namespace {

__global__ void decode_inputs_kernel(const float* __restrict__ proj, DecodeInputs in,
                                     const int32_t* __restrict__ positions,
                                     const float* __restrict__ gate_bias, double base) {
  const int64_t b = blockIdx.x;
  const float* row = proj + b * in.width;
  const double pos = static_cast<double>(positions[b]);
  // Rotated q and k: channel pairs of every head.
  for (int part = 0; part < 4; ++part) {  // q, then k of branches 0..2
    const bool is_q = part == 0;
    if (!is_q && in.k[part - 1] == nullptr) continue;
    const int64_t heads = is_q ? in.H : in.G;
    const float* src = row + (is_q ? 0 : in.k_offset[part - 1]);
    bf16* dst = (is_q ? in.q : in.k[part - 1]) + b * heads * in.dk;
    for (int64_t idx = threadIdx.x; idx < heads * in.dk / 2; idx += blockDim.x) {
      const int64_t h = idx / (in.dk / 2), i = idx % (in.dk / 2), off = h * in.dk + 2 * i;
      float fc, fs;
      rope_cos_sin(pos, i, in.dk, base, false, fc, fs);
      const float x0 = src[off], x1 = src[off + 1];
      dst[off] = __float2bfloat16(x0 * fc - x1 * fs);
      dst[off + 1] = __float2bfloat16(x0 * fs + x1 * fc);
    }
  }
  for (int c = 0; c < 3; ++c) {
    if (in.v[c] == nullptr) continue;
    for (int64_t idx = threadIdx.x; idx < in.G * in.dv; idx += blockDim.x)
      in.v[c][b * in.G * in.dv + idx] = __float2bfloat16(row[in.v_offset[c] + idx]);
  }
  if (in.gate[0] == nullptr) return;
  for (int64_t h = threadIdx.x; h < in.H; h += blockDim.x) {
    float v[3];
    for (int c = 0; c < 3; ++c) v[c] = row[in.gate_offset + h * 3 + c] + gate_bias[h * 3 + c];
    gate_values(v, in.softmax);
    for (int c = 0; c < 3; ++c)
      in.gate[c][b * in.H + h] = __float2bfloat16(in.enabled[c] ? v[c] : 0.0f);
  }
}

}  // namespace

void launch_decode_inputs(const float* proj, const DecodeInputs& in, const int32_t* positions,
                          const float* gate_bias, double rope_base, int64_t B,
                          cudaStream_t stream) {
  if (B == 0) return;
  decode_inputs_kernel<<<static_cast<unsigned>(B), 256, 0, stream>>>(proj, in, positions, gate_bias,
                                                                     rope_base);
  NSA_CUDA_LAUNCH_CHECK();
}

}  // namespace nsa::cuda
