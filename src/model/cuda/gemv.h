// Linear layers for a few rows (decoding: one token of each of B ≤ kGemvMaxRows sequences): y =
// x·Wᵀ is then a matrix-vector product bound by reading W, where cuBLAS' GEMMs at M = 1..3 take
// longer. Each warp streams one row of W with 128-bit loads, all in flight, against the B rows of
// x (fp32 sums in a fixed order: bitwise reproducible, whatever the batch's other rows hold); the
// RMSNorm before a product can be folded in (GemvInput). The kernels are programmatic dependent
// launches (common/dependent_launch.cuh) that load their W rows before they wait for the previous
// kernel, so W's latency hides behind it where that kernel lets its dependents start.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "model/cuda/gemm.h"

namespace nsa::cuda {

// Rows the kernels take. Each row of x costs every W chunk a load and 8 conversions and FMAs, so
// the few-row kernels lose to the GEMMs from a handful of rows on: measured in the decoder step
// (H100, m7c_125m, 64k context; docs/perf.md) at B = 1 / 2 / 3 / 4 / 6 / 16 the step took
// 0.88 / 0.91 / 0.97 / 1.01 / 1.12 / 1.67× the GEMMs' time. The tensor-core skinny kernels
// (skinny_gemm.h) beat them from two rows on (H200, 64k: the step at B = 2 / 3 took 0.405 /
// 0.437 ms on them against 0.431 / 0.515 here), so the decoder uses these at one row only
// (kGemvFasterRows) and the skinny kernels from there to 16 rows.
constexpr int64_t kGemvMaxRows = 4;
constexpr int64_t kGemvFasterRows = 1;

// The rows a product reads: bf16 rows as they are, or fp32 rows RMS-normalised on the fly with
// weight norm_w – launch_rmsnorm_forward's arithmetic and bf16 rounding bit for bit, so the
// product equals the norm kernel followed by the plain product, one kernel fewer.
struct GemvInput {
  const __nv_bfloat16* x = nullptr;  // [B, in]
  const float* x_f32 = nullptr;      // [B, in], normalised with norm_w [in] and eps
  const float* norm_w = nullptr;
  float eps = 0.0f;
};
inline GemvInput gemv_rows(const __nv_bfloat16* x) {
  return GemvInput{x, nullptr, nullptr, 0.0f};
}
inline GemvInput gemv_normed_rows(const float* x, const float* norm_w, float eps) {
  return GemvInput{nullptr, x, norm_w, eps};
}

// The operand rules the small-batch products share (these and skinny_gemm.h's): one kind of rows
// (bf16, or fp32 with a norm weight), `in` positive and below 2^31, and the rows, the norm weight,
// W and W3 (where given) 16-byte aligned.
bool small_product_operands_fit(int64_t in, const GemvInput& x, const __nv_bfloat16* w,
                                const __nv_bfloat16* w3);

// Whether the kernels take this product: 1 ≤ B ≤ kGemvMaxRows, in a multiple of 8 and the rows, W
// (and w3) 16-byte aligned, normalised rows and their weight ((B + 1)·in floats) within 200 KiB of
// shared memory; otherwise use Gemm (and launch_rmsnorm_forward).
bool gemv_fits(int64_t B, int64_t in, const GemvInput& x, const __nv_bfloat16* w,
               const __nv_bfloat16* w3 = nullptr);

// y (+)= x·Wᵀ: x [B, in], W [out, in] bf16 (as Gemm::linear_forward), y [B, out] fp32 or bf16,
// beta 0 (write) or 1 (y += …, fp32 only: the residual add).
void launch_gemv(const GemvInput& x, const __nv_bfloat16* w, GemmOut y, int64_t B, int64_t in,
                 int64_t out, float beta, cudaStream_t stream);

// The MLP's first half in one pass: m [B, out] = swiglu(u1, u3) with u1 = x·W1ᵀ and u3 = x·W3ᵀ
// each rounded to bf16 first – the two GEMMs with bf16 results and launch_swiglu_forward's
// arithmetic (pointwise.cuh); w3 null: SiLU (m = silu(u1)).
void launch_gemv_swiglu(const GemvInput& x, const __nv_bfloat16* w1, const __nv_bfloat16* w3,
                        __nv_bfloat16* m, int64_t B, int64_t in, int64_t out, cudaStream_t stream);

}  // namespace nsa::cuda
