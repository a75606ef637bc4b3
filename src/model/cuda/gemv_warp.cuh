// One warp's output column of a few-row product (gemv.h), shared by the kernels that end in
// different epilogues (gemv.cu: plain, residual, SwiGLU; decode_projection.cu: the attention
// inputs). The warp streams one row of W (and W3) with 128-bit loads – the first kPrefetch chunks
// of each lane before the kernel waits for its predecessor – against the B rows of x; each lane
// keeps one fp32 sum per row, summed in chunk order, and the lanes meet in a butterfly: a fixed
// order, so the bits depend neither on the launch nor on the other rows. A normalised input is
// staged in shared memory (the norm weight before the wait, the fp32 rows after), then every warp
// takes each row's RMS the way rmsnorm_forward_kernel does and forms the chunks of the normalised
// bf16 row as that kernel would have written them.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "cuda/common/block_reduce.cuh"
#include "cuda/common/mma.cuh"
#include "model/cuda/gemv.h"
#include "model/cuda/pointwise.cuh"
#include "model/cuda/vec_access.cuh"

namespace nsa::cuda::gemv_warp {

constexpr int kChunk = 8;     // bf16 per 128-bit load
constexpr int kPrefetch = 8;  // chunks per lane loaded before the wait (in ≤ 2048: the whole row)
// Normalised input: its B fp32 rows and the norm weight staged in shared memory, up to this.
constexpr size_t kMaxStagedBytes = 200 * 1024;

__host__ __device__ inline size_t staged_bytes(int64_t B, int64_t in) {
  return static_cast<size_t>((B + 1) * in) * sizeof(float);
}

// What a column reads: the rows x, W (and W3: a second sum per row, SwiGLU's up projection).
struct Operands {
  GemvInput x;
  const __nv_bfloat16* w1;  // [out, in]
  const __nv_bfloat16* w3;  // null: one sum per row
  int B, in;
};

__device__ __forceinline__ uint4 load_chunk(const uint4* row, int c, int chunks) {
  return c < chunks ? __ldg(row + c) : make_uint4(0, 0, 0, 0);
}

// Before the wait: the norm weight (a weight: it never changes) behind the B rows in xs.
__device__ __forceinline__ void stage_norm_weight(const Operands& a, float* xs) {
  const int64_t row_quads = static_cast<int64_t>(a.B) * a.in / 4;
  for (int64_t i = threadIdx.x; i < a.in / 4; i += blockDim.x)
    cp_async<16>(xs + 4 * (row_quads + i), a.x.norm_w + 4 * i);
}

// After the wait: the fp32 rows [B, in] into xs (16-byte copies: in % 8 == 0), the whole CTA.
// Its own loops, not a helper shared with decode_inputs' copy: that one carried an unaligned path
// into every product and made the B = 1 decode step 4 % slower (docs/perf.md).
__device__ __forceinline__ void stage_rows(const Operands& a, float* xs) {
  const int64_t row_quads = static_cast<int64_t>(a.B) * a.in / 4;
  for (int64_t i = threadIdx.x; i < row_quads; i += blockDim.x)
    cp_async<16>(xs + 4 * i, a.x.x_f32 + 4 * i);
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();
}

// 1 / RMS of each fp32 row b < B of xs (warp_rms_rstd, as the norm kernel: the same bits).
template <int BM>
__device__ __forceinline__ void row_rstd(const Operands& a, const float* xs, int lane,
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
__device__ __forceinline__ void accumulate(const Operands& a, const float* xs, int c,
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

// Column n of a warp (rows n of W1 and, for kTwo with a W3, of W3): construct before the wait
// (the prefetch), sum after it and after stage_rows (every lane gets the same sums).
template <int BM, bool kTwo>
struct WarpColumn {
  const uint4* w1;
  const uint4* w3;
  int have;  // chunks of the row to read (0 for a column past the output)
  bool two;
  uint4 pre1[kPrefetch], pre3[kPrefetch];

  __device__ __forceinline__ WarpColumn(const Operands& a, int64_t n, bool live, int lane) {
    const int chunks = a.in / kChunk;
    two = kTwo && a.w3;
    w1 = reinterpret_cast<const uint4*>(a.w1) + (live ? n : 0) * chunks;
    w3 = two ? reinterpret_cast<const uint4*>(a.w3) + (live ? n : 0) * chunks : nullptr;
    have = live ? chunks : 0;
#pragma unroll
    for (int u = 0; u < kPrefetch; ++u) {
      pre1[u] = load_chunk(w1, lane + 32 * u, have);
      pre3[u] = two ? load_chunk(w3, lane + 32 * u, have) : make_uint4(0, 0, 0, 0);
    }
  }

  template <bool kNorm>
  __device__ __forceinline__ void sums(const Operands& a, const float* xs, int lane, float acc1[BM],
                                       float acc3[BM]) {
    float r[BM] = {};
    if (kNorm) row_rstd<BM>(a, xs, lane, r);
#pragma unroll
    for (int b = 0; b < BM; ++b) acc1[b] = 0.0f, acc3[b] = 0.0f;
#pragma unroll
    for (int u = 0; u < kPrefetch; ++u) {
      const int c = lane + 32 * u;
      if (c < have) accumulate<BM, kNorm>(a, xs, c, r, pre1[u], pre3[u], two, acc1, acc3);
    }
    for (int c = lane + 32 * kPrefetch; c < have; c += 32) {
      const uint4 v1 = __ldg(w1 + c);
      const uint4 v3 = two ? __ldg(w3 + c) : make_uint4(0, 0, 0, 0);
      accumulate<BM, kNorm>(a, xs, c, r, v1, v3, two, acc1, acc3);
    }
#pragma unroll
    for (int b = 0; b < BM; ++b) {
      acc1[b] = warp_sum(acc1[b]);  // every lane gets the same bits
      if (two) acc3[b] = warp_sum(acc3[b]);
    }
  }
};

}  // namespace nsa::cuda::gemv_warp
