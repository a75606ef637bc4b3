// Linear layers for a batch of decoding rows (2 to 16 sequences): y = x·Wᵀ with M = B rows is
// bound by reading W, and cuBLAS' GEMMs take about as long at M = 16 as at 4 (docs/perf.md); the
// few-row kernels (gemv.h) pay per row in conversions and FMAs. Here the tensor cores do the
// arithmetic with W as the MMA's row operand: (W·xᵀ)ᵀ, m16n8k16 tiles of 16 rows of W against 8
// rows of x (two such tiles past 8 rows), so a row of x costs W nothing extra. Sums in a fixed
// order (each warp's share of `in` in order, then the warps' in order): a row's bits do not depend
// on the batch's other rows. W's loads are issued before the kernel waits for its predecessor
// (common/dependent_launch.cuh), as the few-row kernels do, and as there the RMSNorm before a
// product can be folded in (GemvInput's normalised rows) and the MLP's two products and SwiGLU
// made one pass.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "model/cuda/gemm.h"
#include "model/cuda/gemv.h"

namespace nsa::cuda {

constexpr int64_t kSkinnyMaxRows = 16;

// Whether the skinny kernels take the product: 1 ≤ B ≤ kSkinnyMaxRows, in a positive multiple of
// 32 below 2^31, the rows (bf16, or fp32 with a norm weight) and W (and w3) 16-byte aligned, and
// normalised rows' staging ((B + 1)·in floats and B·in bf16) within 192 KiB of shared memory;
// otherwise use Gemm (and launch_rmsnorm_forward).
bool skinny_gemm_fits(int64_t B, int64_t in, const GemvInput& x, const __nv_bfloat16* w,
                      const __nv_bfloat16* w3 = nullptr);

// y (+)= x·Wᵀ: x [B, in], W [out, in] bf16 (as Gemm::linear_forward), y [B, out] fp32 or bf16,
// beta 0 (write) or 1 (y += …, fp32 only: the residual add).
void launch_skinny_gemm(const GemvInput& x, const __nv_bfloat16* w, GemmOut y, int64_t B,
                        int64_t in, int64_t out, float beta, cudaStream_t stream);

// The MLP's first half in one pass (as launch_gemv_swiglu): m [B, out] = swiglu(u1, u3) with
// u1 = x·W1ᵀ and u3 = x·W3ᵀ each rounded to bf16 first; w3 null: SiLU (m = silu(u1)).
void launch_skinny_swiglu(const GemvInput& x, const __nv_bfloat16* w1, const __nv_bfloat16* w3,
                          __nv_bfloat16* m, int64_t B, int64_t in, int64_t out,
                          cudaStream_t stream);

}  // namespace nsa::cuda
