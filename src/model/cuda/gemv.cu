// Few-row linear layers (see gemv.h): one warp per output column n (a row of W), its lanes
// striding over 128-bit chunks of that row; each lane keeps one fp32 sum per row of x, summed in
// chunk order, then the lanes' sums meet in a butterfly – a fixed order, so the bits do not depend
// on the launch or on the other rows. The first kPrefetch chunks of a lane's W row (all of it up
// to in = 32·8·kPrefetch) load before the kernel waits for its predecessor. With a normalised
// input the CTA first copies the fp32 rows to shared memory (one round trip after the wait; the
// norm weight, which never changes, before it), then every warp takes each row's RMS the way
// rmsnorm_forward_kernel does (lane l sums the squares of column quads l, l + 32, … in order, then
// warp_sum) and forms each chunk of the normalised bf16 row as that kernel would have written it.
#include "cuda/common/block_reduce.cuh"
#include "cuda/common/cuda_check.h"
#include "cuda/common/dependent_launch.cuh"
#include "cuda/common/dynamic_smem.h"
#include "cuda/common/mma.cuh"
#include "model/cuda/gemv.h"
#include "model/cuda/pointwise.cuh"
#include "model/cuda/vec_access.cuh"
#include "nsa/error.h"

namespace nsa::cuda {
namespace {

using bf16 = __nv_bfloat16;

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kChunk = 8;     // bf16 per 128-bit load
constexpr int kPrefetch = 8;  // chunks per lane loaded before the wait (in ≤ 2048: the whole row)
// Normalised input: its B fp32 rows and the norm weight staged in shared memory, up to this.
constexpr size_t kMaxStagedBytes = 200 * 1024;

struct GemvArgs {
  GemvInput x;
  const bf16* w1;  // [out, in]
  const bf16* w3;  // SwiGLU's second weight (null: SiLU / a plain product)
  void* y;         // [B, out]: fp32 or bf16 (plain), bf16 m (SwiGLU)
  bool y_bf16;
  bool accumulate;  // y += (fp32)
  int B, in, out;
};

__device__ __forceinline__ uint4 load_chunk(const uint4* row, int c, int chunks) {
  return c < chunks ? __ldg(row + c) : make_uint4(0, 0, 0, 0);
}

// 1 / RMS of each fp32 row b < B of xs (the rows staged in shared memory; warp_rms_rstd, as the
// norm kernel: the same bits).
template <int BM>
__device__ __forceinline__ void row_rstd(const GemvArgs& a, const float* xs, int lane,
                                         float r[BM]) {
#pragma unroll
  for (int b = 0; b < BM; ++b) {
    if (b >= a.B) break;  // warp-uniform
    const float4* row = reinterpret_cast<const float4*>(xs + static_cast<int64_t>(b) * a.in);
    r[b] = warp_rms_rstd(a.in, a.x.eps, lane, [&](int64_t q, float v[4]) {
      const float4 x = row[q];
      v[0] = x.x, v[1] = x.y, v[2] = x.z, v[3] = x.w;
    });
  }
}

// acc1[b] (acc3[b]) += x[b, chunk c] · the W1 (W3) chunk, for the rows b < B (warp-uniform),
// elements in order; x's chunk is the bf16 row's, or the normalised fp32 row's (xs, with the norm
// weight after the rows, in shared memory) rounded to bf16.
template <int BM, bool kNorm>
__device__ __forceinline__ void accumulate(const GemvArgs& a, const float* xs, int c,
                                           const float r[BM], const uint4& w1, const uint4& w3,
                                           bool two, float acc1[BM], float acc3[BM]) {
  float f1[kChunk], f3[kChunk], nw[kChunk];
  unpack_bf16x8(w1, f1);
  if (two) unpack_bf16x8(w3, f3);
  if (kNorm) load_f32x8<false>(xs + static_cast<int64_t>(a.B) * a.in + kChunk * c, nw);
#pragma unroll
  for (int b = 0; b < BM; ++b) {
    if (b >= a.B) break;
    const int64_t at = static_cast<int64_t>(b) * a.in + kChunk * c;
    float xf[kChunk];
    if (kNorm) {
      load_f32x8<false>(xs + at, xf);
#pragma unroll
      for (int k = 0; k < kChunk; ++k)
        xf[k] = __bfloat162float(__float2bfloat16(rms_normed(xf[k], r[b], nw[k])));
    } else {
      unpack_bf16x8(__ldg(reinterpret_cast<const uint4*>(a.x.x + at)), xf);
    }
#pragma unroll
    for (int k = 0; k < kChunk; ++k) acc1[b] = fmaf(xf[k], f1[k], acc1[b]);
    if (two) {
#pragma unroll
      for (int k = 0; k < kChunk; ++k) acc3[b] = fmaf(xf[k], f3[k], acc3[b]);
    }
  }
}

// BM: rows of x the sums are kept for (B ≤ BM); kSwiglu: two W rows per column and m out; kNorm:
// x is fp32 and RMS-normalised on the way.
template <int BM, bool kSwiglu, bool kNorm>
__global__ void __launch_bounds__(kThreads) gemv_kernel(const GemvArgs a) {
  const int lane = threadIdx.x % 32;
  const int64_t n = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  const int chunks = a.in / kChunk;
  const bool live = n < a.out;
  const bool two = kSwiglu && a.w3;
  const uint4* w1 = reinterpret_cast<const uint4*>(a.w1) + (live ? n : 0) * chunks;
  const uint4* w3 = two ? reinterpret_cast<const uint4*>(a.w3) + (live ? n : 0) * chunks : nullptr;
  const int have = live ? chunks : 0;
  uint4 pre1[kPrefetch], pre3[kPrefetch];
#pragma unroll
  for (int u = 0; u < kPrefetch; ++u) {
    pre1[u] = load_chunk(w1, lane + 32 * u, have);
    pre3[u] = two ? load_chunk(w3, lane + 32 * u, have) : make_uint4(0, 0, 0, 0);
  }
  // Normalised input: rows [B, in] then the norm weight [in], staged (16-byte copies: in % 8 == 0).
  // Its own loops, not a helper shared with decode_inputs' copy: that one carried an unaligned
  // path into every product and made the B = 1 decode step 4 % slower (docs/perf.md).
  extern __shared__ __align__(16) float xs[];
  const int64_t row_quads = static_cast<int64_t>(a.B) * a.in / 4;
  if (kNorm) {
    for (int64_t i = threadIdx.x; i < a.in / 4; i += blockDim.x)
      cp_async16(xs + 4 * (row_quads + i), a.x.norm_w + 4 * i);
  }
  wait_for_previous_kernel();  // x (and y) come from the kernels before
  if (kNorm) {
    for (int64_t i = threadIdx.x; i < row_quads; i += blockDim.x)
      cp_async16(xs + 4 * i, a.x.x_f32 + 4 * i);
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();
  }
  if (!live) return;  // warp-uniform
  float r[BM] = {};
  if (kNorm) row_rstd<BM>(a, xs, lane, r);
  float acc1[BM], acc3[BM];
#pragma unroll
  for (int b = 0; b < BM; ++b) acc1[b] = 0.0f, acc3[b] = 0.0f;
#pragma unroll
  for (int u = 0; u < kPrefetch; ++u) {
    const int c = lane + 32 * u;
    if (c < chunks) accumulate<BM, kNorm>(a, xs, c, r, pre1[u], pre3[u], two, acc1, acc3);
  }
  for (int c = lane + 32 * kPrefetch; c < chunks; c += 32) {
    const uint4 v1 = __ldg(w1 + c);
    const uint4 v3 = two ? __ldg(w3 + c) : make_uint4(0, 0, 0, 0);
    accumulate<BM, kNorm>(a, xs, c, r, v1, v3, two, acc1, acc3);
  }
#pragma unroll
  for (int b = 0; b < BM; ++b) {
    acc1[b] = warp_sum(acc1[b]);  // every lane gets the same bits
    if (two) acc3[b] = warp_sum(acc3[b]);
  }
#pragma unroll
  for (int b = 0; b < BM; ++b) {
    if (b >= a.B || lane != b) continue;
    const int64_t i = static_cast<int64_t>(b) * a.out + n;
    if (kSwiglu) {  // u1, u3 rounded to bf16 as the GEMMs' bf16 results, then m's arithmetic
      const float u1 = __bfloat162float(__float2bfloat16(acc1[b]));
      const float u3 = two ? __bfloat162float(__float2bfloat16(acc3[b])) : 1.0f;
      static_cast<bf16*>(a.y)[i] = __float2bfloat16(swiglu_value(u1, u3));
    } else if (a.y_bf16) {
      static_cast<bf16*>(a.y)[i] = __float2bfloat16(acc1[b]);
    } else {
      float* y = static_cast<float*>(a.y);
      y[i] = a.accumulate ? y[i] + acc1[b] : acc1[b];
    }
  }
}

size_t staged_bytes(int64_t B, int64_t in) {
  return static_cast<size_t>((B + 1) * in) * sizeof(float);
}

template <bool kSwiglu, bool kNorm>
void launch_rows(const GemvArgs& a, cudaStream_t stream) {
  static_assert(kGemvMaxRows == 4, "one kernel per power of two up to kGemvMaxRows");
  const dim3 grid(static_cast<unsigned>((a.out + kWarps - 1) / kWarps));
  const auto kernel = a.B <= 1   ? gemv_kernel<1, kSwiglu, kNorm>
                      : a.B <= 2 ? gemv_kernel<2, kSwiglu, kNorm>
                                 : gemv_kernel<4, kSwiglu, kNorm>;
  const size_t smem = kNorm ? staged_bytes(a.B, a.in) : 0;
  allow_dynamic_smem(kernel, smem);
  launch_dependent(kernel, grid, dim3(kThreads), smem, stream, a);
}

template <bool kSwiglu>
void launch(const GemvArgs& a, cudaStream_t stream) {
  if (a.B == 0 || a.out == 0) return;
  if (a.x.x_f32) {
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

bool gemv_fits(int64_t B, int64_t in, const GemvInput& x, const bf16* w, const bf16* w3) {
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  const bool rows =
      x.x_f32 ? !x.x && x.norm_w && aligned(x.x_f32) && aligned(x.norm_w) : x.x && aligned(x.x);
  return rows && B >= 1 && B <= kGemvMaxRows && in > 0 && in % kChunk == 0 &&
         in < (int64_t{1} << 31) && w && aligned(w) && (!w3 || aligned(w3)) &&
         (!x.x_f32 || staged_bytes(B, in) <= kMaxStagedBytes);
}

void launch_gemv(const GemvInput& x, const bf16* w, GemmOut y, int64_t B, int64_t in, int64_t out,
                 float beta, cudaStream_t stream) {
  check_args(B, in, out, x, w, nullptr, "launch_gemv");
  NSA_CHECK(beta == 0.0f || (beta == 1.0f && !y.bf16),
            "launch_gemv: beta must be 0, or 1 with an fp32 result (got ", beta, ")");
  const GemvArgs a{x,
                   w,
                   nullptr,
                   y.ptr,
                   y.bf16,
                   beta == 1.0f,
                   static_cast<int>(B),
                   static_cast<int>(in),
                   static_cast<int>(out)};
  launch<false>(a, stream);
}

void launch_gemv_swiglu(const GemvInput& x, const bf16* w1, const bf16* w3, bf16* m, int64_t B,
                        int64_t in, int64_t out, cudaStream_t stream) {
  check_args(B, in, out, x, w1, w3, "launch_gemv_swiglu");
  const GemvArgs a{
      x, w1, w3, m, true, false, static_cast<int>(B), static_cast<int>(in), static_cast<int>(out)};
  launch<true>(a, stream);
}

}  // namespace nsa::cuda
