// Few-row linear layers (see gemv.h): one warp per output column n (a row of W), its lanes
// striding over 128-bit chunks of that row; each lane keeps one fp32 sum per row of x, summed in
// chunk order, then the lanes' sums meet in a butterfly – a fixed order, so the bits do not depend
// on the launch or on the other rows. The first kPrefetch chunks of a lane's W row (all of it up
// to in = 32·8·kPrefetch) load before the kernel waits for its predecessor.
#include "cuda/common/cuda_check.h"
#include "cuda/common/dependent_launch.cuh"
#include "model/cuda/gemv.h"
#include "model/cuda/pointwise.cuh"
#include "nsa/error.h"

namespace nsa::cuda {
namespace {

using bf16 = __nv_bfloat16;

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kChunk = 8;     // bf16 per 128-bit load
constexpr int kPrefetch = 8;  // chunks per lane loaded before the wait (in ≤ 2048: the whole row)

struct GemvArgs {
  const bf16* x;   // [B, in]
  const bf16* w1;  // [out, in]
  const bf16* w3;  // SwiGLU's second weight (null: SiLU / a plain product)
  void* y;         // [B, out]: fp32 or bf16 (plain), bf16 m (SwiGLU)
  bool y_bf16;
  bool accumulate;  // y += (fp32)
  int B, in, out;
};

__device__ __forceinline__ void unpack(const uint4& raw, float f[kChunk]) {
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
  for (int k = 0; k < kChunk / 2; ++k) {
    const float2 v = __bfloat1622float2(h[k]);
    f[2 * k] = v.x, f[2 * k + 1] = v.y;
  }
}

__device__ __forceinline__ uint4 load_chunk(const uint4* row, int c, int chunks) {
  return c < chunks ? __ldg(row + c) : make_uint4(0, 0, 0, 0);
}

// acc[b] += x[b, chunk c] · w chunk, for the rows b < B (warp-uniform), elements in order.
template <int BM>
__device__ __forceinline__ void accumulate(const uint4* x, int chunks, int B, int c, const uint4& w,
                                           float acc[BM]) {
  float wf[kChunk];
  unpack(w, wf);
#pragma unroll
  for (int b = 0; b < BM; ++b) {
    if (b < B) {
      float xf[kChunk];
      unpack(__ldg(x + static_cast<int64_t>(b) * chunks + c), xf);
#pragma unroll
      for (int k = 0; k < kChunk; ++k) acc[b] = fmaf(xf[k], wf[k], acc[b]);
    }
  }
}

// Every lane ends with the warp's sum (xor butterfly: both lanes of a pair add the same two
// values, so they agree bit for bit).
template <int BM>
__device__ __forceinline__ void warp_sum(float acc[BM]) {
#pragma unroll
  for (int b = 0; b < BM; ++b) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) acc[b] += __shfl_xor_sync(0xffffffffu, acc[b], off);
  }
}

// BM: rows of x the sums are kept for (B ≤ BM); kSwiglu: two W rows per column and m out.
template <int BM, bool kSwiglu>
__global__ void __launch_bounds__(kThreads) gemv_kernel(const GemvArgs a) {
  const int lane = threadIdx.x % 32;
  const int64_t n = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  const int chunks = a.in / kChunk;
  const bool live = n < a.out;
  const uint4* w1 = reinterpret_cast<const uint4*>(a.w1) + (live ? n : 0) * chunks;
  const uint4* w3 =
      kSwiglu && a.w3 ? reinterpret_cast<const uint4*>(a.w3) + (live ? n : 0) * chunks : nullptr;
  const int have = live ? chunks : 0;
  uint4 pre1[kPrefetch], pre3[kPrefetch];
#pragma unroll
  for (int u = 0; u < kPrefetch; ++u) {
    pre1[u] = load_chunk(w1, lane + 32 * u, have);
    pre3[u] = kSwiglu && w3 ? load_chunk(w3, lane + 32 * u, have) : make_uint4(0, 0, 0, 0);
  }
  wait_for_previous_kernel();  // x (and y) come from the kernels before
  if (!live) return;           // warp-uniform
  const uint4* x = reinterpret_cast<const uint4*>(a.x);
  float acc1[BM], acc3[BM];
#pragma unroll
  for (int b = 0; b < BM; ++b) acc1[b] = 0.0f, acc3[b] = 0.0f;
#pragma unroll
  for (int u = 0; u < kPrefetch; ++u) {
    const int c = lane + 32 * u;
    if (c < chunks) {
      accumulate<BM>(x, chunks, a.B, c, pre1[u], acc1);
      if (kSwiglu && w3) accumulate<BM>(x, chunks, a.B, c, pre3[u], acc3);
    }
  }
  for (int c = lane + 32 * kPrefetch; c < chunks; c += 32) {
    const uint4 v1 = __ldg(w1 + c);
    const uint4 v3 = kSwiglu && w3 ? __ldg(w3 + c) : make_uint4(0, 0, 0, 0);
    accumulate<BM>(x, chunks, a.B, c, v1, acc1);
    if (kSwiglu && w3) accumulate<BM>(x, chunks, a.B, c, v3, acc3);
  }
  warp_sum<BM>(acc1);
  if (kSwiglu && w3) warp_sum<BM>(acc3);
#pragma unroll
  for (int b = 0; b < BM; ++b) {
    if (b >= a.B || lane != b % 32) continue;
    const int64_t i = static_cast<int64_t>(b) * a.out + n;
    if (kSwiglu) {  // u1, u3 rounded to bf16 as the GEMMs' bf16 results, then m's arithmetic
      const float u1 = __bfloat162float(__float2bfloat16(acc1[b]));
      const float u3 = w3 ? __bfloat162float(__float2bfloat16(acc3[b])) : 1.0f;
      static_cast<bf16*>(a.y)[i] = __float2bfloat16(swiglu_value(u1, u3));
    } else if (a.y_bf16) {
      static_cast<bf16*>(a.y)[i] = __float2bfloat16(acc1[b]);
    } else {
      float* y = static_cast<float*>(a.y);
      y[i] = a.accumulate ? y[i] + acc1[b] : acc1[b];
    }
  }
}

template <bool kSwiglu>
void launch(const GemvArgs& a, cudaStream_t stream) {
  if (a.B == 0 || a.out == 0) return;
  const dim3 grid(static_cast<unsigned>((a.out + kWarps - 1) / kWarps));
  static_assert(kGemvMaxRows == 4, "one kernel per power of two up to kGemvMaxRows");
  const auto kernel = a.B <= 1   ? gemv_kernel<1, kSwiglu>
                      : a.B <= 2 ? gemv_kernel<2, kSwiglu>
                                 : gemv_kernel<4, kSwiglu>;
  launch_dependent(kernel, grid, dim3(kThreads), 0, stream, a);
}

void check_args(int64_t B, int64_t in, int64_t out, const bf16* x, const bf16* w, const bf16* w3,
                const char* what) {
  NSA_CHECK(gemv_fits(B, in, x, w, w3), what, ": B = ", B, " rows and in = ", in, " (B in [1, ",
            kGemvMaxRows,
            "], in a multiple of 8 below 2^31, 16-byte aligned "
            "operands; else use Gemm)");
  NSA_CHECK(out >= 0 && out < (int64_t{1} << 31), what, ": out = ", out, " outside [0, 2^31)");
}

}  // namespace

bool gemv_fits(int64_t B, int64_t in, const bf16* x, const bf16* w, const bf16* w3) {
  const auto aligned = [](const bf16* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  return B >= 1 && B <= kGemvMaxRows && in > 0 && in % kChunk == 0 && in < (int64_t{1} << 31) &&
         aligned(x) && aligned(w) && (!w3 || aligned(w3));
}

void launch_gemv(const bf16* x, const bf16* w, GemmOut y, int64_t B, int64_t in, int64_t out,
                 float beta, cudaStream_t stream) {
  check_args(B, in, out, x, w, nullptr, "launch_gemv");
  NSA_CHECK(beta == 0.0f || (beta == 1.0f && !y.bf16),
            "launch_gemv: beta must be 0, or 1 with an fp32 result (got ", beta, ")");
  GemvArgs a{x,
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

void launch_gemv_swiglu(const bf16* x, const bf16* w1, const bf16* w3, bf16* m, int64_t B,
                        int64_t in, int64_t out, cudaStream_t stream) {
  check_args(B, in, out, x, w1, w3, "launch_gemv_swiglu");
  GemvArgs a{
      x, w1, w3, m, true, false, static_cast<int>(B), static_cast<int>(in), static_cast<int>(out)};
  launch<true>(a, stream);
}

}  // namespace nsa::cuda
