// Skinny products on the tensor cores (skinny_gemm.h): a CTA takes 16 rows of W (16 outputs), its
// warps split `in` into runs of 32-column chunks. A thread loads 16 bytes of W rows gid and gid + 8
// (gid = lane / 4) and 16 bytes of x row n at the same 8 columns, chunk by chunk; the 8 columns
// serve two m16n8k16 k-steps – columns 0-3 of the thread's 8 as the step's logical columns
// 2·tig, 2·tig + 1, 2·tig + 8, 2·tig + 9 (tig = lane % 4), columns 4-7 the next step's. W and x
// take the same permutation, so each k-step sums 16 distinct columns once: the product is x·Wᵀ
// with the columns in another (fixed) order. Normalised rows are staged in shared memory (the norm
// weight before the wait, the fp32 rows after, gemv_warp.cuh's staging) and written there once as
// the bf16 rows the norm kernel would have written; the MMAs then read x from there.
#include <algorithm>

#include "cuda/common/dependent_launch.cuh"
#include "cuda/common/dynamic_smem.h"
#include "cuda/common/mma.cuh"
#include "model/cuda/gemv_warp.cuh"
#include "model/cuda/pointwise.cuh"
#include "model/cuda/skinny_gemm.h"
#include "nsa/error.h"

namespace nsa::cuda {
namespace {

using bf16 = __nv_bfloat16;

constexpr int kRowsPerCta = 16;    // the MMA's M: rows of W
constexpr int kChunkCols = 32;     // a thread's 16 bytes × 4 lanes of a quad
constexpr int kChunksPerLoad = 4;  // chunks a warp has in flight (W: 8 loads a thread, 16 with W3)
constexpr int kMaxWarps = 16;
constexpr int kMaxTiles = 2;  // n-tiles of 8 rows of x: B ≤ 16
constexpr int kRowPad = 8;    // bf16 after each staged row: its 16-byte pieces spread over banks

// The normalised input's staging (dynamic shared memory) at most: with the kernel's own arrays
// (the warps' partial tiles, up to 32 KiB, and the rows' 1 / RMS) within the 227 KiB a CTA may
// have. (200 KiB, gemv_warp's limit, let 9-16 rows of in ≈ 1,900-2,040 pass the check and then
// fail at the launch.)
constexpr size_t kMaxNormedBytes = 192 * 1024;
static_assert(kMaxNormedBytes + sizeof(float) * kMaxWarps * 2 * kMaxTiles * 4 * 32 +
                      sizeof(float) * kSkinnyMaxRows <=
                  227 * 1024,
              "the staging and the kernel's static shared memory within a CTA's 227 KiB");

struct SkinnyArgs {
  gemv_warp::Operands ops;  // x (bf16, or fp32 rows with a norm weight), W1, W3 (SwiGLU), B, in
  void* y;                  // [B, out]: fp32 or bf16 (plain), bf16 m (SwiGLU)
  int out;
  bool y_bf16, accumulate;
};

// Shared memory of a normalised input: the fp32 rows [B, in] and the norm weight [in]
// (gemv_warp's staging), then the bf16 rows [B, in + kRowPad].
size_t normed_bytes(int64_t B, int64_t in) {
  return gemv_warp::staged_bytes(B, in) + static_cast<size_t>(B * (in + kRowPad)) * sizeof(bf16);
}

// The warps that split `in`: enough that each has at most kChunksPerLoad chunks in flight at once –
// the same for a normalised input as for a plain one, whatever the CTA's warps, so that both sum
// the same chunks in the same order (the same bits).
__host__ __device__ inline int run_warps(int in) {
  const int chunks = in / kChunkCols;
  return min(kMaxWarps, (chunks + kChunksPerLoad - 1) / kChunksPerLoad);
}

__device__ __forceinline__ uint4 load_w(const bf16* w, int64_t row, int in, int col, bool live) {
  if (!live) return make_uint4(0, 0, 0, 0);
  return __ldg(reinterpret_cast<const uint4*>(w + row * in + col));
}

// After stage_rows: the rows' 1 / RMS (a warp a row, warp_rms_rstd: the norm kernel's bits), then
// the normalised bf16 rows into xb, the whole CTA, 8 elements a thread at a time (in % 32 == 0):
// an element a thread with a division by `in` each cost the 16-row products 4-5 µs (docs/perf.md).
__device__ __forceinline__ void normalise_rows(const gemv_warp::Operands& a, const float* xs,
                                               bf16* xb) {
  __shared__ float rstd[kSkinnyMaxRows];
  const int lane = threadIdx.x % 32, warps = blockDim.x / 32;
  for (int b = threadIdx.x / 32; b < a.B; b += warps) {
    const float4* row = reinterpret_cast<const float4*>(xs + static_cast<int64_t>(b) * a.in);
    const float r = warp_rms_rstd(a.in, a.x.eps, lane, [&](int64_t q, float v[4]) {
      const float4 x = row[q];
      v[0] = x.x, v[1] = x.y, v[2] = x.z, v[3] = x.w;
    });
    if (lane == 0) rstd[b] = r;
  }
  __syncthreads();
  const float* nw = xs + static_cast<int64_t>(a.B) * a.in;
  const int pieces = a.in / 8;  // of 8 elements a row
  for (int i = threadIdx.x; i < a.B * pieces; i += blockDim.x) {
    const int b = i / pieces, k = (i - b * pieces) * 8;
    float x[8], w[8];
    load_f32x8(xs + static_cast<int64_t>(b) * a.in + k, x);
    load_f32x8(nw + k, w);
#pragma unroll
    for (int e = 0; e < 8; ++e) x[e] = rms_normed(x[e], rstd[b], w[e]);
    store_bf16x8(xb + b * (a.in + kRowPad) + k, x);  // rounded to nearest, as __float2bfloat16
  }
  __syncthreads();
}

// NT n-tiles of x (8 rows each); kNorm: x normalised on the way (staged); kSwiglu: W1 and W3, m
// out.
template <int NT, bool kNorm, bool kSwiglu>
__global__ void __launch_bounds__(32 * kMaxWarps) skinny_kernel(const SkinnyArgs a) {
  constexpr int kSums = kSwiglu ? 2 : 1;
  __shared__ float partial[kMaxWarps][kSums * NT * 4][32];
  extern __shared__ __align__(16) unsigned char staged[];  // kNorm: normed_bytes
  const gemv_warp::Operands& o = a.ops;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = run_warps(a.ops.in);
  const int gid = lane / 4, tig = lane % 4;
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * kRowsPerCta;
  const bool live_a = r0 + gid < a.out, live_b = r0 + gid + 8 < a.out;
  const bool two = kSwiglu && o.w3;
  const int chunks = o.in / kChunkCols, per = (chunks + warps - 1) / warps;
  const int c_begin = min(chunks, warp * per), c_end = min(chunks, c_begin + per);
  uint4 wa[kSums][kChunksPerLoad], wb[kSums][kChunksPerLoad];
  const auto load_run = [&](int c0) {
#pragma unroll
    for (int j = 0; j < kChunksPerLoad; ++j) {
      const bool in_run = c0 + j < c_end;
      const int col = (c0 + j) * kChunkCols + tig * 8;
#pragma unroll
      for (int s = 0; s < kSums; ++s) {
        const bf16* w = s == 0 ? o.w1 : o.w3;
        const bool use = s == 0 || two;
        wa[s][j] = load_w(w, r0 + gid, o.in, col, use && in_run && live_a);
        wb[s][j] = load_w(w, r0 + gid + 8, o.in, col, use && in_run && live_b);
      }
    }
  };
  float* xs = reinterpret_cast<float*>(staged);
  bf16* xb = reinterpret_cast<bf16*>(staged + gemv_warp::staged_bytes(o.B, o.in));
  load_run(c_begin);  // W never changes: loaded before the wait
  if (kNorm) gemv_warp::stage_norm_weight(o, xs);
  wait_for_previous_kernel();  // x (and y) come from the kernels before
  // The outputs this thread writes: v = threadIdx.x + j·blockDim (j < kOuts), at index `at` of y.
  // The residual's old values (accumulate) are loaded first, so that their round trip overlaps the
  // products instead of following them.
  constexpr int kOuts = NT * 4;  // a thread's outputs at most (one warp: NT·4·32 values / 32)
  const auto out_at = [&](int v, int64_t& at) {
    const int i = v / 32, l = v % 32, nt = i / 4, e = i % 4;
    const int64_t row = r0 + l / 4 + (e >= 2 ? 8 : 0);
    const int n = nt * 8 + (l % 4) * 2 + (e & 1);
    at = static_cast<int64_t>(n) * a.out + row;
    return row < a.out && n < o.B;
  };
  float y_old[kOuts] = {};
  if (!kSwiglu && a.accumulate) {
#pragma unroll
    for (int j = 0; j < kOuts; ++j) {
      const int v = threadIdx.x + j * blockDim.x;
      int64_t at;
      if (v < kOuts * 32 && out_at(v, at)) y_old[j] = static_cast<const float*>(a.y)[at];
    }
  }
  if (kNorm) {
    gemv_warp::stage_rows(o, xs);
    normalise_rows(o, xs, xb);
  }
  const auto x_piece = [&](int n, int col) {
    if (n >= o.B) return make_uint4(0, 0, 0, 0);
    if (kNorm) return *reinterpret_cast<const uint4*>(xb + n * (o.in + kRowPad) + col);
    return __ldg(reinterpret_cast<const uint4*>(o.x.x + static_cast<int64_t>(n) * o.in + col));
  };
  float acc[kSums][NT][4] = {};
  for (int c0 = c_begin; c0 < c_end; c0 += kChunksPerLoad) {
    if (c0 != c_begin) load_run(c0);
#pragma unroll
    for (int j = 0; j < kChunksPerLoad; ++j) {
      if (c0 + j >= c_end) break;
      const int col = (c0 + j) * kChunkCols + tig * 8;
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const uint4 xv = x_piece(nt * 8 + gid, col);
        const uint32_t b0[2] = {xv.x, xv.y}, b1[2] = {xv.z, xv.w};
#pragma unroll
        for (int s = 0; s < kSums; ++s) {
          const uint32_t a0[4] = {wa[s][j].x, wb[s][j].x, wa[s][j].y, wb[s][j].y};
          mma_16816(acc[s][nt], a0, b0);
          const uint32_t a1[4] = {wa[s][j].z, wb[s][j].z, wa[s][j].w, wb[s][j].w};
          mma_16816(acc[s][nt], a1, b1);
        }
      }
    }
  }
#pragma unroll
  for (int s = 0; s < kSums; ++s)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) partial[warp][(s * NT + nt) * 4 + e][lane] = acc[s][nt][e];
  __syncthreads();
  // Value i of lane l (v = 32·i + l): tile i / 4, element i % 4 (c0, c1: row gid; c2, c3: row
  // gid + 8; columns 2·tig and 2·tig + 1 of the tile), summed over the warps in order.
#pragma unroll
  for (int j = 0; j < kOuts; ++j) {
    const int v = threadIdx.x + j * blockDim.x;
    if (v >= kOuts * 32) break;
    const int i = v / 32, l = v % 32;
    int64_t at;
    if (!out_at(v, at)) continue;
    float sum[kSums] = {};
    for (int w = 0; w < warps; ++w)
#pragma unroll
      for (int s = 0; s < kSums; ++s) sum[s] += partial[w][s * NT * 4 + i][l];
    if (kSwiglu) {  // u1, u3 rounded to bf16 as the GEMMs' bf16 results, then m's arithmetic
      const float u1 = __bfloat162float(__float2bfloat16(sum[0]));
      const float u3 = two ? __bfloat162float(__float2bfloat16(sum[kSums - 1])) : 1.0f;
      static_cast<bf16*>(a.y)[at] = __float2bfloat16(swiglu_value(u1, u3));
    } else if (a.y_bf16) {
      static_cast<bf16*>(a.y)[at] = __float2bfloat16(sum[0]);
    } else {
      static_cast<float*>(a.y)[at] = a.accumulate ? y_old[j] + sum[0] : sum[0];
    }
  }
}

template <bool kNorm, bool kSwiglu>
void launch_tiles(const SkinnyArgs& a, cudaStream_t stream) {
  // Past 8 rows (two n-tiles) the CTAs that normalise the rows take all kMaxWarps to share that
  // work; their extra warps have no run of `in` (run_warps in the kernel).
  const int warps = kNorm && a.ops.B > 8 ? kMaxWarps : run_warps(a.ops.in);
  const dim3 grid(static_cast<unsigned>((a.out + kRowsPerCta - 1) / kRowsPerCta));
  const auto kernel =
      a.ops.B <= 8 ? skinny_kernel<1, kNorm, kSwiglu> : skinny_kernel<kMaxTiles, kNorm, kSwiglu>;
  const size_t smem = kNorm ? normed_bytes(a.ops.B, a.ops.in) : 0;
  allow_dynamic_smem(kernel, smem);
  launch_dependent(kernel, grid, dim3(32 * warps), smem, stream, a);
}

template <bool kSwiglu>
void launch(const SkinnyArgs& a, cudaStream_t stream) {
  if (a.out == 0) return;
  if (a.ops.x.x_f32) {
    launch_tiles<true, kSwiglu>(a, stream);
  } else {
    launch_tiles<false, kSwiglu>(a, stream);
  }
}

void check_args(int64_t B, int64_t in, int64_t out, const GemvInput& x, const bf16* w,
                const bf16* w3, const char* what) {
  NSA_CHECK(skinny_gemm_fits(B, in, x, w, w3), what, ": B = ", B, " rows and in = ", in,
            " (B in [1, ", kSkinnyMaxRows,
            "], in a positive multiple of 32 below 2^31, 16-byte aligned operands, the rows bf16 "
            "or fp32 with a norm weight, normalised rows within 192 KiB; else use Gemm)");
  NSA_CHECK(out >= 0 && out < (int64_t{1} << 31), what, ": out = ", out, " outside [0, 2^31)");
}

}  // namespace

bool skinny_gemm_fits(int64_t B, int64_t in, const GemvInput& x, const bf16* w, const bf16* w3) {
  return small_product_operands_fit(in, x, w, w3) && B >= 1 && B <= kSkinnyMaxRows &&
         in % kChunkCols == 0 && (!x.x_f32 || normed_bytes(B, in) <= kMaxNormedBytes);
}

void launch_skinny_gemm(const GemvInput& x, const bf16* w, GemmOut y, int64_t B, int64_t in,
                        int64_t out, float beta, cudaStream_t stream) {
  check_args(B, in, out, x, w, nullptr, "launch_skinny_gemm");
  NSA_CHECK(beta == 0.0f || (beta == 1.0f && !y.bf16),
            "launch_skinny_gemm: beta must be 0, or 1 with an fp32 result (got ", beta, ")");
  const SkinnyArgs a{gemv_warp::Operands{x, w, nullptr, static_cast<int>(B), static_cast<int>(in)},
                     y.ptr, static_cast<int>(out), y.bf16, beta == 1.0f};
  launch<false>(a, stream);
}

void launch_skinny_swiglu(const GemvInput& x, const bf16* w1, const bf16* w3, bf16* m, int64_t B,
                          int64_t in, int64_t out, cudaStream_t stream) {
  check_args(B, in, out, x, w1, w3, "launch_skinny_swiglu");
  const SkinnyArgs a{gemv_warp::Operands{x, w1, w3, static_cast<int>(B), static_cast<int>(in)}, m,
                     static_cast<int>(out), true, false};
  launch<true>(a, stream);
}

}  // namespace nsa::cuda
