// What the tensor-core NSA kernels share: which keys a query sees in each branch, where a
// branch's K/V rows live, and the copies of row tiles from global memory into bf16 shared tiles
// and fragments (common/mma.cuh has the fragment layouts).
#pragma once

#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>

#include "common/fast_exp.cuh"
#include "common/mma.cuh"
#include "nsa_params.h"

namespace nsa::cuda {

// Visible compressed tokens for query t: i·d + l <= t + 1.
__device__ __forceinline__ int64_t num_visible(const NsaParams& p, int64_t t) {
  return t + 1 < p.l ? 0 : (t + 1 - p.l) / p.d + 1;
}

// The masks' hyper-parameters in 32 bits (positions within a sequence fit).
struct MaskParams {
  int d, l, w;
};
__device__ __forceinline__ MaskParams mask_params(const NsaParams& p) {
  return {static_cast<int>(p.d), static_cast<int>(p.l), static_cast<int>(p.w)};
}

// Does query t (position in its sequence) see key j of branch B (a compressed token index for
// kCmp, a raw position otherwise)? The selected branch's block choice is applied by its caller.
template <Branch B>
__device__ __forceinline__ bool key_visible(MaskParams m, int t, int j) {
  if constexpr (B == Branch::kWin) return j <= t && j > t - m.w;
  if constexpr (B == Branch::kCmp) return j * m.d + m.l <= t + 1;
  return j <= t;
}

// Does every query of [t_lo, t_hi] see every key of [j_lo, j_hi]? Then a tile needs no mask.
template <Branch B>
__device__ __forceinline__ bool all_visible(MaskParams m, int t_lo, int t_hi, int j_lo, int j_hi) {
  if constexpr (B == Branch::kWin) return j_hi <= t_lo && j_lo > t_hi - m.w;
  if constexpr (B == Branch::kCmp) return j_hi * m.d + m.l <= t_lo + 1;
  return j_hi <= t_lo;
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

// K and V rows (bf16) of one branch for sequence n, group g: row j at k + j·stride. The
// compressed branch reads the bf16 copies of the compressed K/V.
struct KvRows {
  const bf16* k;
  const bf16* v;
  int64_t k_stride, v_stride;
};
__device__ __forceinline__ KvRows compressed_rows(const NsaParams& p, int64_t n, int64_t g) {
  const int64_t c0 = p.cmp_offsets[n] * p.G + g;
  return {p.k_cmp_bf16 + c0 * p.dk, p.v_cmp_bf16 + c0 * p.dv, p.G * p.dk, p.G * p.dv};
}
__device__ __forceinline__ KvRows raw_rows(const NsaParams& p, int branch, int64_t n, int64_t g) {
  const int64_t r0 = p.cu_seqlens[n] * p.G + g;
  return {p.k[branch] + r0 * p.dk, p.v[branch] + r0 * p.dv, p.G * p.dk, p.G * p.dv};
}
template <Branch B>
__device__ __forceinline__ KvRows branch_rows(const NsaParams& p, int64_t n, int64_t g) {
  if constexpr (B == Branch::kCmp) return compressed_rows(p, n, g);
  return raw_rows(p, static_cast<int>(B), n, g);
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
// take consecutive 16-byte chunks (coalesced). With `kAsync` (bf16 sources only) the copies are
// cp.async and the caller commits and waits.
template <int D, bool kAsync = false, typename RowPtr>
__device__ __forceinline__ void load_tile(bf16* dst, int R, RowPtr row_ptr, int tid,
                                          int n_threads) {
  constexpr int kChunks = D / 8;
  for (int idx = tid; idx < R * kChunks; idx += n_threads) {
    const int i = idx / kChunks, c = idx % kChunks;
    const auto* src = row_ptr(i);
    bf16* dst_chunk = dst + i * tile_stride(D) + c * 8;
    if (src == nullptr) {
      *reinterpret_cast<uint4*>(dst_chunk) = make_uint4(0, 0, 0, 0);
    } else if constexpr (kAsync) {
      cp_async<16>(dst_chunk, src + c * 8);
    } else {
      *reinterpret_cast<uint4*>(dst_chunk) = load8(src + c * 8);
    }
  }
}

// A run of key rows [k0, k0 + nk) (nk <= 0: an empty chunk).
struct KeyChunk {
  int64_t k0, nk;
};

// The step of a two-stage cp.async pipeline: starts chunk it + 1 (if any) with issue(it + 1), then
// waits for chunk it (one commit group per chunk).
template <typename Issue>
__device__ __forceinline__ void issue_next_wait_current(int64_t it, int64_t n, Issue issue) {
  if (it + 1 < n) {
    issue(it + 1);
    cp_async_wait<1>();
  } else {
    cp_async_wait<0>();
  }
}

// Two-stage pipeline of K/V tiles of KT rows in shared memory, filled with cp.async while the
// previous tile is being used. Chunk `it` comes from chunks(it). Either the whole CTA
// (kWarp = false) or one warp (kWarp = true, its own buffers) runs it. Usage:
//   pipe.start(n);
//   for (it = 0; it < n; ++it) { c = pipe.acquire(it, n); ...use pipe.k(it), pipe.v(it)...;
//   pipe.release(); }
template <int DK, int DV, int KT, bool kWarp, typename Chunks>
struct KvPipeline {
  static constexpr size_t kBytes = 2 * KT * (tile_stride(DK) + tile_stride(DV)) * sizeof(bf16);
  bf16* buf;
  KvRows kv;
  Chunks chunks;

  __device__ bf16* k(int64_t it) const {
    return buf + (it & 1) * KT * (tile_stride(DK) + tile_stride(DV));
  }
  __device__ bf16* v(int64_t it) const { return k(it) + KT * tile_stride(DK); }
  __device__ void sync() const {
    if constexpr (kWarp) {
      __syncwarp();
    } else {
      __syncthreads();
    }
  }
  __device__ void issue(int64_t it) const {
    const KeyChunk c = chunks(it);
    const int tid = kWarp ? (threadIdx.x & 31) : threadIdx.x;
    const int n = kWarp ? 32 : blockDim.x;
    load_tile<DK, true>(
        k(it), KT, [&](int i) { return i < c.nk ? kv.k + (c.k0 + i) * kv.k_stride : nullptr; }, tid,
        n);
    load_tile<DV, true>(
        v(it), KT, [&](int i) { return i < c.nk ? kv.v + (c.k0 + i) * kv.v_stride : nullptr; }, tid,
        n);
    cp_async_commit();
  }
  __device__ void start(int64_t n) const {
    if (n > 0) issue(0);
  }
  // Starts chunk it + 1, waits for chunk it, and returns it.
  __device__ KeyChunk acquire(int64_t it, int64_t n) const {
    issue_next_wait_current(it, n, [this](int64_t next) { issue(next); });
    sync();
    return chunks(it);
  }
  // Chunk it's buffers may be refilled (by the issue in the next acquire).
  __device__ void release() const { sync(); }
};

template <int DK, int DV, int KT, bool kWarp, typename Chunks>
__device__ KvPipeline<DK, DV, KT, kWarp, Chunks> make_pipeline(unsigned char* smem, KvRows kv,
                                                               Chunks chunks) {
  return {reinterpret_cast<bf16*>(smem), kv, chunks};
}

// Scales a warp's 16 × KT scores to the log2 domain and masks them: key j = k0 + column, row
// t = t0 + row; rows >= n_rows and columns >= nk are masked too. Skips the per-element test when
// the whole tile is visible to the warp's rows.
template <Branch B, int NT>
__device__ __forceinline__ void scale_and_mask(float s[][4], MaskParams m, int t0, int n_rows,
                                               int k0, int nk, float sl2) {
  const int tq = threadIdx.x & 3, gid = (threadIdx.x & 31) >> 2;
  if (n_rows >= 16 && nk >= NT * 8 && all_visible<B>(m, t0, t0 + 15, k0, k0 + NT * 8 - 1)) {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) s[nt][e] *= sl2;
    }
    return;
  }
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int r = gid + (e >> 1) * 8, c = nt * 8 + 2 * tq + (e & 1);
      const bool vis = r < n_rows && c < nk && key_visible<B>(m, t0 + r, k0 + c);
      s[nt][e] = vis ? s[nt][e] * sl2 : -INFINITY;
    }
  }
}

// Key rows per chunk of the selected branch (kernels with one warp per query row).
constexpr int kSelChunkRows = 32;

// The selected branch's chunks for one query: kSelChunkRows-row pieces of each chosen block, cut at
// the query's own row t (chunks past it are empty).
struct SelectedChunks {
  const int32_t* blocks;
  int64_t l_sel, t, per_block;
  __device__ KeyChunk operator()(int64_t it) const {
    const int64_t b = blocks[it / per_block], k0 = b * l_sel + (it % per_block) * kSelChunkRows;
    const int64_t block_end = (b + 1) * l_sel < t + 1 ? (b + 1) * l_sel : t + 1;
    const int64_t nk = block_end - k0 < kSelChunkRows ? block_end - k0 : kSelChunkRows;
    return {k0, nk};
  }
};

__device__ __forceinline__ int64_t count_blocks(const int32_t* blocks, int64_t n_sel) {
  int64_t n = 0;
  while (n < n_sel && blocks[n] >= 0) ++n;
  return n;
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

// S (16 × 8·NT, fp32) += A (16 × D, fragments) · Yᵀ, Y a row-major shared tile of 8·NT rows.
template <int D, int NT>
__device__ __forceinline__ void mma_a_bt(float s[][4], const uint32_t a[][4], const bf16* Y) {
  static_assert(NT % 2 == 0, "n-tiles are loaded in pairs");
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
#pragma unroll
    for (int nt = 0; nt < NT; nt += 2) {
      uint32_t b[4];
      load_b_rows_x2(b, Y, tile_stride(D), nt * 8, kk * 16);
      mma_16816(s[nt], a[kk], b);
      mma_16816(s[nt + 1], a[kk], b + 2);
    }
  }
}

// The same with A = rows r0..r0+15 of a row-major shared tile X (16 × D).
template <int D, int NT>
__device__ __forceinline__ void mma_smem_a_bt(float s[][4], const bf16* X, int r0, const bf16* Y) {
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    uint32_t a[1][4];
    load_a(a[0], X, tile_stride(D), r0, kk * 16);
#pragma unroll
    for (int nt = 0; nt < NT; nt += 2) {
      uint32_t b[4];
      load_b_rows_x2(b, Y, tile_stride(D), nt * 8, kk * 16);
      mma_16816(s[nt], a[0], b);
      mma_16816(s[nt + 1], a[0], b + 2);
    }
  }
}

// O (16 × D, fp32) += P (16 × 16·KS, C fragments) · Z, Z a row-major shared tile of 16·KS rows × D.
template <int D, int KS>
__device__ __forceinline__ void mma_c_b(float o[][4], const float pc[][4], const bf16* Z) {
  static_assert(D % 16 == 0, "n-tiles are loaded in pairs");
#pragma unroll
  for (int kk = 0; kk < KS; ++kk) {
    uint32_t a[4];
    c_to_a(a, pc[2 * kk], pc[2 * kk + 1]);
#pragma unroll
    for (int nt = 0; nt < D / 8; nt += 2) {
      uint32_t b[4];
      load_b_cols_x2(b, Z, tile_stride(D), kk * 16, nt * 8);
      mma_16816(o[nt], a, b);
      mma_16816(o[nt + 1], a, b + 2);
    }
  }
}

}  // namespace nsa::cuda
