// Skinny products on the tensor cores (skinny_gemm.h): a CTA takes 16 rows of W (16 outputs), its
// warps split `in` into runs of 32-column chunks. A thread loads 16 bytes of W rows gid and gid + 8
// (gid = lane / 4) and 16 bytes of x row n at the same 8 columns, chunk by chunk; the 8 columns
// serve two m16n8k16 k-steps – columns 0-3 of the thread's 8 as the step's logical columns
// 2·tig, 2·tig + 1, 2·tig + 8, 2·tig + 9 (tig = lane % 4), columns 4-7 the next step's. W and x
// take the same permutation, so each k-step sums 16 distinct columns once: the product is x·Wᵀ
// with the columns in another (fixed) order. No shared memory but the warps' partial tiles.
#include <algorithm>

#include "cuda/common/dependent_launch.cuh"
#include "cuda/common/mma.cuh"
#include "model/cuda/skinny_gemm.h"
#include "nsa/error.h"

namespace nsa::cuda {
namespace {

using bf16 = __nv_bfloat16;

constexpr int kRowsPerCta = 16;    // the MMA's M: rows of W
constexpr int kChunkCols = 32;     // a thread's 16 bytes × 4 lanes of a quad
constexpr int kChunksPerLoad = 4;  // chunks a warp has in flight (W: 8 loads a thread)
constexpr int kMaxWarps = 16;
constexpr int kMaxTiles = 2;  // n-tiles of 8 rows of x: B ≤ 16

struct SkinnyArgs {
  const bf16* x;
  const bf16* w;
  void* y;
  int B, in, out;
  bool y_bf16, accumulate;
};

__device__ __forceinline__ uint4 load_w(const bf16* w, int64_t row, int in, int col, bool live) {
  if (!live) return make_uint4(0, 0, 0, 0);
  return __ldg(reinterpret_cast<const uint4*>(w + row * in + col));
}

// NT n-tiles of x (8 rows each).
template <int NT>
__global__ void __launch_bounds__(32 * kMaxWarps) skinny_kernel(const SkinnyArgs a) {
  __shared__ float partial[kMaxWarps][NT * 4][32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  const int gid = lane / 4, tig = lane % 4;
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * kRowsPerCta;
  const bool live_a = r0 + gid < a.out, live_b = r0 + gid + 8 < a.out;
  const int chunks = a.in / kChunkCols, per = (chunks + warps - 1) / warps;
  const int c_begin = min(chunks, warp * per), c_end = min(chunks, c_begin + per);
  uint4 wa[kChunksPerLoad], wb[kChunksPerLoad];
  const auto load_run = [&](int c0) {
#pragma unroll
    for (int j = 0; j < kChunksPerLoad; ++j) {
      const bool in_run = c0 + j < c_end;
      const int col = (c0 + j) * kChunkCols + tig * 8;
      wa[j] = load_w(a.w, r0 + gid, a.in, col, in_run && live_a);
      wb[j] = load_w(a.w, r0 + gid + 8, a.in, col, in_run && live_b);
    }
  };
  load_run(c_begin);           // W never changes: loaded before the wait
  wait_for_previous_kernel();  // x (and y) come from the kernels before
  float acc[NT][4] = {};
  for (int c0 = c_begin; c0 < c_end; c0 += kChunksPerLoad) {
    if (c0 != c_begin) load_run(c0);
#pragma unroll
    for (int j = 0; j < kChunksPerLoad; ++j) {
      if (c0 + j >= c_end) break;
      const int col = (c0 + j) * kChunkCols + tig * 8;
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const int n = nt * 8 + gid;
        const uint4 xv =
            n < a.B
                ? __ldg(reinterpret_cast<const uint4*>(a.x + static_cast<int64_t>(n) * a.in + col))
                : make_uint4(0, 0, 0, 0);
        const uint32_t a0[4] = {wa[j].x, wb[j].x, wa[j].y, wb[j].y};
        const uint32_t b0[2] = {xv.x, xv.y};
        mma_16816(acc[nt], a0, b0);
        const uint32_t a1[4] = {wa[j].z, wb[j].z, wa[j].w, wb[j].w};
        const uint32_t b1[2] = {xv.z, xv.w};
        mma_16816(acc[nt], a1, b1);
      }
    }
  }
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) partial[warp][nt * 4 + e][lane] = acc[nt][e];
  __syncthreads();
  // Value i of lane l: tile i / 4, element i % 4 (c0, c1: row gid; c2, c3: row gid + 8; columns
  // 2·tig and 2·tig + 1 of the tile), summed over the warps in order.
  for (int v = threadIdx.x; v < NT * 4 * 32; v += blockDim.x) {
    const int i = v / 32, l = v % 32, nt = i / 4, e = i % 4;
    const int64_t row = r0 + l / 4 + (e >= 2 ? 8 : 0);
    const int n = nt * 8 + (l % 4) * 2 + (e & 1);
    if (row >= a.out || n >= a.B) continue;
    float sum = 0.0f;
    for (int w = 0; w < warps; ++w) sum += partial[w][i][l];
    const int64_t at = static_cast<int64_t>(n) * a.out + row;
    if (a.y_bf16) {
      static_cast<bf16*>(a.y)[at] = __float2bfloat16(sum);
    } else {
      float* y = static_cast<float*>(a.y);
      y[at] = a.accumulate ? y[at] + sum : sum;
    }
  }
}

}  // namespace

bool skinny_gemm_fits(int64_t B, int64_t in, const bf16* x, const bf16* w) {
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  return B >= 1 && B <= kSkinnyMaxRows && in > 0 && in % kChunkCols == 0 &&
         in < (int64_t{1} << 31) && x && w && aligned(x) && aligned(w);
}

void launch_skinny_gemm(const bf16* x, const bf16* w, GemmOut y, int64_t B, int64_t in, int64_t out,
                        float beta, cudaStream_t stream) {
  NSA_CHECK(skinny_gemm_fits(B, in, x, w), "launch_skinny_gemm: B = ", B, " rows and in = ", in,
            " (B in [1, ", kSkinnyMaxRows,
            "], in a positive multiple of 32 below 2^31, x and W 16-byte aligned; else use Gemm)");
  NSA_CHECK(out >= 0 && out < (int64_t{1} << 31), "launch_skinny_gemm: out = ", out,
            " outside [0, 2^31)");
  NSA_CHECK(beta == 0.0f || (beta == 1.0f && !y.bf16),
            "launch_skinny_gemm: beta must be 0, or 1 with an fp32 result (got ", beta, ")");
  if (out == 0) return;
  const SkinnyArgs a{
      x,      w,           y.ptr, static_cast<int>(B), static_cast<int>(in), static_cast<int>(out),
      y.bf16, beta == 1.0f};
  // Warps a CTA: enough that each has at most kChunksPerLoad chunks in flight at once.
  const int64_t chunks = in / kChunkCols;
  const int warps = static_cast<int>(
      std::min<int64_t>(kMaxWarps, (chunks + kChunksPerLoad - 1) / kChunksPerLoad));
  const dim3 grid(static_cast<unsigned>((out + kRowsPerCta - 1) / kRowsPerCta));
  const auto kernel = B <= 8 ? skinny_kernel<1> : skinny_kernel<kMaxTiles>;
  launch_dependent(kernel, grid, dim3(32 * warps), 0, stream, a);
}

}  // namespace nsa::cuda
