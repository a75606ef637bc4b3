// Few-row linear layers (see gemv.h): one warp per output column n (a row of W), its lanes
// striding over 128-bit chunks of that row (gemv_warp.cuh, whose column sums the decoder's input
// projection shares); the epilogues here write y, add it to the residual, or form SwiGLU's m.
#include "cuda/common/cuda_check.h"
#include "cuda/common/dependent_launch.cuh"
#include "cuda/common/dynamic_smem.h"
#include "model/cuda/gemv.h"
#include "model/cuda/gemv_warp.cuh"
#include "nsa/error.h"

namespace nsa::cuda {
namespace {

using bf16 = __nv_bfloat16;
using namespace gemv_warp;

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;

struct GemvArgs {
  Operands ops;
  void* y;  // [B, out]: fp32 or bf16 (plain), bf16 m (SwiGLU)
  bool y_bf16;
  bool accumulate;  // y += (fp32)
  int out;
};

// BM: rows of x the sums are kept for (B ≤ BM); kSwiglu: two W rows per column and m out; kNorm:
// x is fp32 and RMS-normalised on the way.
template <int BM, bool kSwiglu, bool kNorm>
__global__ void __launch_bounds__(kThreads) gemv_kernel(const GemvArgs a) {
  const int lane = threadIdx.x % 32;
  const int64_t n = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  const bool live = n < a.out;
  WarpColumn<BM, kSwiglu> col(a.ops, n, live, lane);
  extern __shared__ __align__(16) float xs[];  // normalised input: rows [B, in], norm weight [in]
  if (kNorm) stage_norm_weight(a.ops, xs);
  wait_for_previous_kernel();  // x (and y) come from the kernels before
  // The residual's old value (lane b holds row b's) is loaded first, so that its round trip
  // overlaps the sums instead of following them.
  float y_old = 0.0f;
  if (!kSwiglu && a.accumulate && live && lane < a.ops.B)
    y_old = static_cast<const float*>(a.y)[static_cast<int64_t>(lane) * a.out + n];
  if (kNorm) stage_rows(a.ops, xs);
  if (!live) return;  // warp-uniform
  float acc1[BM], acc3[BM];
  col.template sums<kNorm>(a.ops, xs, lane, acc1, acc3);
#pragma unroll
  for (int b = 0; b < BM; ++b) {
    if (b >= a.ops.B || lane != b) continue;
    const int64_t i = static_cast<int64_t>(b) * a.out + n;
    if (kSwiglu) {  // u1, u3 rounded to bf16 as the GEMMs' bf16 results, then m's arithmetic
      const float u1 = __bfloat162float(__float2bfloat16(acc1[b]));
      const float u3 = col.two ? __bfloat162float(__float2bfloat16(acc3[b])) : 1.0f;
      static_cast<bf16*>(a.y)[i] = __float2bfloat16(swiglu_value(u1, u3));
    } else if (a.y_bf16) {
      static_cast<bf16*>(a.y)[i] = __float2bfloat16(acc1[b]);
    } else {
      static_cast<float*>(a.y)[i] = a.accumulate ? y_old + acc1[b] : acc1[b];
    }
  }
}

template <bool kSwiglu, bool kNorm>
void launch_rows(const GemvArgs& a, cudaStream_t stream) {
  static_assert(kGemvMaxRows == 4, "one kernel per power of two up to kGemvMaxRows");
  const dim3 grid(static_cast<unsigned>((a.out + kWarps - 1) / kWarps));
  const int B = a.ops.B;
  const auto kernel = B <= 1   ? gemv_kernel<1, kSwiglu, kNorm>
                      : B <= 2 ? gemv_kernel<2, kSwiglu, kNorm>
                               : gemv_kernel<4, kSwiglu, kNorm>;
  const size_t smem = kNorm ? staged_bytes(B, a.ops.in) : 0;
  allow_dynamic_smem(kernel, smem);
  launch_dependent(kernel, grid, dim3(kThreads), smem, stream, a);
}

template <bool kSwiglu>
void launch(const GemvArgs& a, cudaStream_t stream) {
  if (a.ops.B == 0 || a.out == 0) return;
  if (a.ops.x.x_f32) {
    launch_rows<kSwiglu, true>(a, stream);
  } else {
    launch_rows<kSwiglu, false>(a, stream);
  }
}

void check_args(int64_t B, int64_t in, int64_t out, const GemvInput& x, const bf16* w,
                const bf16* w3, const char* what) {
  NSA_CHECK(
      gemv_fits(B, in, x, w, w3), what, ": B = ", B, " rows and in = ", in, " (B in [1, ",
      kGemvMaxRows,
      "], in a multiple of 8 below 2^31, 16-byte aligned operands, the rows bf16 or fp32 with "
      "a norm weight; else use Gemm)");
  NSA_CHECK(out >= 0 && out < (int64_t{1} << 31), what, ": out = ", out, " outside [0, 2^31)");
}

}  // namespace

bool small_product_operands_fit(int64_t in, const GemvInput& x, const bf16* w, const bf16* w3) {
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  const bool rows =
      x.x_f32 ? !x.x && x.norm_w && aligned(x.x_f32) && aligned(x.norm_w) : x.x && aligned(x.x);
  return rows && in > 0 && in < (int64_t{1} << 31) && w && aligned(w) && (!w3 || aligned(w3));
}

bool gemv_fits(int64_t B, int64_t in, const GemvInput& x, const bf16* w, const bf16* w3) {
  return small_product_operands_fit(in, x, w, w3) && B >= 1 && B <= kGemvMaxRows &&
         in % kChunk == 0 && (!x.x_f32 || staged_bytes(B, in) <= kMaxStagedBytes);
}

void launch_gemv(const GemvInput& x, const bf16* w, GemmOut y, int64_t B, int64_t in, int64_t out,
                 float beta, cudaStream_t stream) {
  check_args(B, in, out, x, w, nullptr, "launch_gemv");
  NSA_CHECK(beta == 0.0f || (beta == 1.0f && !y.bf16),
            "launch_gemv: beta must be 0, or 1 with an fp32 result (got ", beta, ")");
  const GemvArgs a{Operands{x, w, nullptr, static_cast<int>(B), static_cast<int>(in)}, y.ptr,
                   y.bf16, beta == 1.0f, static_cast<int>(out)};
  launch<false>(a, stream);
}

void launch_gemv_swiglu(const GemvInput& x, const bf16* w1, const bf16* w3, bf16* m, int64_t B,
                        int64_t in, int64_t out, cudaStream_t stream) {
  check_args(B, in, out, x, w1, w3, "launch_gemv_swiglu");
  const GemvArgs a{Operands{x, w1, w3, static_cast<int>(B), static_cast<int>(in)}, m, true, false,
                   static_cast<int>(out)};
  launch<true>(a, stream);
}

}  // namespace nsa::cuda
