// 2^x as one instruction, and the constants that turn natural-log softmax arithmetic into base 2
// – shared by the training kernels' softmax (nsa/tiles.cuh) and decoding's (nsa/decode_tile.cuh).
#pragma once

namespace nsa::cuda {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// 2^x as one MUFU.EX2. exp2f adds a compare and two multiplies per call to keep subnormal results;
// the softmax loops do not need them (their exponents are <= 0 and results below 2^-126 are
// negligible next to the row's 1), and the instructions were the kernels' busiest pipe.
// 2^-inf = 0, which the loops use for masked scores.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// e^x as one multiply and one MUFU.EX2 – __expf's result wherever it is a normal float (its
// subnormal guard, a compare and two multiplies on the chain, is what this drops; below 2^-126 it
// gives 0). For the decode merges' chains of dependent exponentials at batch 1.
__device__ __forceinline__ float fast_exp(float x) {
  return fast_exp2(x * kLog2e);
}

}  // namespace nsa::cuda
