// Per-element math shared by the model's kernels (training and decoding), so that both compute
// the rotary angles, the gates, RMSNorm's output and the SwiGLU activation identically.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace nsa::cuda {

// cos and sin of θ_i = pos·base^(−2i/D) (in double, as on the CPU); sin negated for the inverse.
__device__ inline void rope_cos_sin(double pos, int64_t i, int64_t D, double base, bool inverse,
                                    float& fc, float& fs) {
  double s, c;
  sincos(pos * pow(base, -2.0 * static_cast<double>(i) / static_cast<double>(D)), &s, &c);
  fc = static_cast<float>(c);
  fs = static_cast<float>(inverse ? -s : s);
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
