// Per-element math shared by the model's kernels (training and decoding), so that both compute
// the rotary angles, the gates, RMSNorm's output and the SwiGLU activation identically.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common/block_reduce.cuh"

namespace nsa::cuda {

// cos and sin of θ_i = pos·base^(−2i/D) (in double, as on the CPU); sin negated for the inverse.
__device__ inline void rope_cos_sin(double pos, int64_t i, int64_t D, double base, bool inverse,
                                    float& fc, float& fs) {
  double s, c;
  sincos(pos * pow(base, -2.0 * static_cast<double>(i) / static_cast<double>(D)), &s, &c);
  fc = static_cast<float>(c);
  fs = static_cast<float>(inverse ? -s : s);
}

// The pair (a, b) rotated by the angle whose cos and sin are fc, fs (the inverse rotation negates
// sin: exact in float, as the CPU's negation in double then rounding) – one expression for every
// kernel that rotates (rope.cu, decode_inputs.cuh), so all contract it the same way.
__device__ inline float2 rope_rotate(float a, float b, float fc, float fs) {
  return make_float2(a * fc - b * fs, a * fs + b * fc);
}

// Gate values of one head from its three logits (bias added): sigmoid each, or softmax over them.
__device__ inline void gate_values(float v[3], bool softmax) {
  if (softmax) {
    const float m = fmaxf(v[0], fmaxf(v[1], v[2]));
    float sum = 0.0f;
    for (int c = 0; c < 3; ++c) sum += (v[c] = expf(v[c] - m));
    for (int c = 0; c < 3; ++c) v[c] /= sum;
  } else {
    for (int c = 0; c < 3; ++c) v[c] = 1.0f / (1.0f + expf(-v[c]));
  }
}

// RMSNorm's 1 / RMS of a row of D floats, by one warp: lane l sums the squares of the column
// quads l, l + 32, … (load(q, v) gives columns 4q .. 4q + 3, zeros past D) in order, each product
// and sum rounded on its own, then warp_sum – the one order of the norm kernel and of the products
// that fold the norm in (gemv.cu), so both give the same bits. Every lane gets the result.
template <typename LoadQuad>
__device__ inline float warp_rms_rstd(int64_t D, float eps, int lane, LoadQuad&& load) {
  float ss = 0.0f;
  for (int64_t q = lane; q < (D + 3) / 4; q += 32) {
    float v[4];
    load(q, v);
    for (int k = 0; k < 4; ++k) ss = __fadd_rn(ss, __fmul_rn(v[k], v[k]));
  }
  return rsqrtf(warp_sum(ss) / static_cast<float>(D) + eps);
}

// RMSNorm's output x·r·w (r = 1 / RMS of the row), each product rounded on its own (never
// contracted): the norm kernel and the products that fold the norm in (gemv.cu) give the same bits.
__device__ inline float rms_normed(float x, float r, float w) {
  return __fmul_rn(__fmul_rn(x, r), w);
}

// SwiGLU's m = silu(a)·b (b = 1: SiLU), each operation rounded on its own (no FMA the compiler
// could form differently in the kernels that compute m: the forward, the backward, the decoder's
// fused product).
__device__ inline float swiglu_value(float a, float b) {
  const float silu = __fdiv_rn(a, __fadd_rn(1.0f, expf(-a)));
  return __fmul_rn(silu, b);
}

}  // namespace nsa::cuda
