// What the tensor-core NSA kernels share: which keys a query sees in each branch, where a
// branch's K/V rows live, and the copies of row tiles from global memory into bf16 shared tiles
// and fragments (common/mma.cuh has the fragment layouts).
#pragma once

#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>

#include "common/mma.cuh"
#include "nsa_params.h"

namespace nsa::cuda {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// Visible compressed tokens for query t: i·d + l <= t + 1.
__device__ __forceinline__ int64_t num_visible(const NsaParams& p, int64_t t) {
  return t + 1 < p.l ? 0 : (t + 1 - p.l) / p.d + 1;
}

// Does query t (position in its sequence) see key j of branch B (a compressed token index for
// kCmp, a raw position otherwise)? The selected branch's block choice is applied by its caller.
template <Branch B>
__device__ __forceinline__ bool key_visible(const NsaParams& p, int64_t t, int64_t j) {
  if constexpr (B == Branch::kWin) return j <= t && j > t - p.w;
  if constexpr (B == Branch::kCmp) return j * p.d + p.l <= t + 1;
  return j <= t;
}

// Keys [begin, end) a dense branch (compressed or window) may show to queries first..last.
struct KeyRange {
  int64_t begin, end;
};
template <Branch B>
__device__ __forceinline__ KeyRange dense_keys(const NsaParams& p, int64_t first, int64_t last) {
  if constexpr (B == Branch::kWin) return {first - p.w + 1 > 0 ? first - p.w + 1 : 0, last + 1};
  return {0, num_visible(p, last)};
}

// K and V rows of branch B for sequence n, group g: row j at k + j·stride (compressed K/V are
// fp32, raw K/V bf16).
template <typename T>
struct KvRows {
  const T* k;
  const T* v;
  int64_t k_stride, v_stride;
};
__device__ __forceinline__ KvRows<float> compressed_rows(const NsaParams& p, int64_t n, int64_t g) {
  const int64_t c0 = p.cmp_offsets[n] * p.G + g;
  return {p.k_cmp + c0 * p.dk, p.v_cmp + c0 * p.dv, p.G * p.dk, p.G * p.dv};
}
__device__ __forceinline__ KvRows<bf16> raw_rows(const NsaParams& p, int branch, int64_t n,
                                                 int64_t g) {
  const int64_t r0 = p.cu_seqlens[n] * p.G + g;
  return {p.k[branch] + r0 * p.dk, p.v[branch] + r0 * p.dv, p.G * p.dk, p.G * p.dv};
}

// Eight consecutive elements as bf16.
__device__ __forceinline__ uint4 load8(const bf16* src) {
  return *reinterpret_cast<const uint4*>(src);
}
__device__ __forceinline__ uint4 load8(const float* src) {
  const float4 a = reinterpret_cast<const float4*>(src)[0];
  const float4 b = reinterpret_cast<const float4*>(src)[1];
  return make_uint4(pack_bf16(a.x, a.y), pack_bf16(a.z, a.w), pack_bf16(b.x, b.y),
                    pack_bf16(b.z, b.w));
}

// Fills rows [0, R) of a bf16 tile with stride tile_stride(D): row i from row_ptr(i) (a T* to D
// contiguous elements), or zeros where row_ptr returns nullptr. Threads tid, tid + n_threads, ...
template <int D, typename RowPtr>
__device__ __forceinline__ void load_tile(bf16* dst, int R, RowPtr row_ptr, int tid,
                                          int n_threads) {
  constexpr int kChunks = D / 8;
  for (int idx = tid; idx < R * kChunks; idx += n_threads) {
    const int i = idx / kChunks, c = idx % kChunks;
    const auto* src = row_ptr(i);
    const uint4 v = src == nullptr ? make_uint4(0, 0, 0, 0) : load8(src + c * 8);
    *reinterpret_cast<uint4*>(dst + i * tile_stride(D) + c * 8) = v;
  }
}

// A fragments (16 rows × D) straight from global memory: row r at row_ptr(r), or zeros.
template <int D, typename RowPtr>
__device__ __forceinline__ void load_a_rows(uint32_t a[][4], RowPtr row_ptr) {
  const int lane = threadIdx.x & 31, gid = lane >> 2, tq = lane & 3;
  const bf16* lo = row_ptr(gid);
  const bf16* hi = row_ptr(gid + 8);
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    const int c = kk * 16 + 2 * tq;
    a[kk][0] = lo ? ld_u32(lo + c) : 0u;
    a[kk][1] = hi ? ld_u32(hi + c) : 0u;
    a[kk][2] = lo ? ld_u32(lo + c + 8) : 0u;
    a[kk][3] = hi ? ld_u32(hi + c + 8) : 0u;
  }
}

// S (16 × 8·NT, fp32) += A (16 × D, fragments) · Yᵀ, Y a row-major tile of 8·NT rows.
template <int D, int NT>
__device__ __forceinline__ void mma_a_bt(float s[][4], const uint32_t a[][4], const bf16* Y) {
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      uint32_t b[2];
      load_b_rows(b, Y, tile_stride(D), nt * 8, kk * 16);
      mma_16816(s[nt], a[kk], b);
    }
  }
}

// O (16 × D, fp32) += P (16 × 16·KS, C fragments) · Z, Z a row-major tile of 16·KS rows × D.
template <int D, int KS>
__device__ __forceinline__ void mma_c_b(float o[][4], const float pc[][4], const bf16* Z) {
#pragma unroll
  for (int kk = 0; kk < KS; ++kk) {
    uint32_t a[4];
    c_to_a(a, pc[2 * kk], pc[2 * kk + 1]);
#pragma unroll
    for (int nt = 0; nt < D / 8; ++nt) {
      uint32_t b[2];
      load_b_cols(b, Z, tile_stride(D), kk * 16, nt * 8);
      mma_16816(o[nt], a, b);
    }
  }
}

}  // namespace nsa::cuda
