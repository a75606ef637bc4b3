// What the warpgroup-MMA (wgmma) attention kernels share: K/V tiles in 128-byte-swizzled shared
// memory (common/wgmma.cuh has the layout), a two-stage TMA pipeline of them, and the two
// products of a flash-style loop with the warpgroup's 64 rows as M:
//   S (64 × KT) = Q·Kᵀ with Q as register fragments, K a K-major tile;
//   O (64 × DV) += P·V with P from the S accumulators, V an MN-major tile
// (and dq's dP = dO·Vᵀ and dq += dS·K, the same two forms). The accumulators use the mma.sync C
// layout per warp (s[nt][e] as in tiles.cuh), so the softmax code of softmax.cuh serves both the
// mma.sync and the wgmma kernels.
//
// A tile of R rows × D (D a multiple of 64) is D/64 sub-tiles of R rows × 64 elements (128 bytes
// per row), sub-tile c at byte c·R·128, each 1024-byte aligned.
#pragma once

#include "common/tma.cuh"
#include "common/wgmma.cuh"
#include "dense_kv_maps.h"
#include "tiles.cuh"

namespace nsa::cuda {

// Dims the wgmma kernels are built for (sub-tiles of 64 elements); others use mma.sync.
__host__ __device__ constexpr bool wgmma_dims(int dk, int dv) {
  return dk % 64 == 0 && dv % 64 == 0;
}

// CTAs per SM a kernel of HC warpgroups is built for: two of two warpgroups up to 64-wide heads
// (128 registers a thread), else one.
template <int DK, int HC>
__host__ __device__ constexpr int wgmma_min_ctas() {
  return HC > 1 && DK <= 64 ? 2 : 1;
}

// Byte offset of element (r, c) of an R-row swizzled tile of D/64 sub-tiles.
__host__ __device__ constexpr uint32_t sw_tile_offset(int R, int r, int c) {
  return static_cast<uint32_t>(c >> 6) * R * 128u + sw128_offset(r, c & 63);
}

// Fills rows [0, R) of a swizzled tile with D columns: row i from row_ptr(i) (D contiguous bf16) or
// zeros where it returns nullptr, by cp.async (the caller commits and waits). The N threads of
// the caller (tid < N) take consecutive 16-byte chunks (coalesced). R and N are compile-time, so
// the loop unrolls into straight-line copies (as a loop with runtime bounds, its index and
// address arithmetic was a tenth of the dK/dV kernels' stall samples).
template <int D, int R, int N, typename RowPtr>
__device__ __forceinline__ void load_sw_tile(unsigned char* dst, RowPtr row_ptr, int tid) {
  constexpr int kChunks = D / 8, kTotal = R * kChunks;
#pragma unroll
  for (int k = 0; k < (kTotal + N - 1) / N; ++k) {
    const int idx = tid + k * N;
    if (kTotal % N != 0 && idx >= kTotal) break;
    const int i = idx / kChunks, c = idx % kChunks;
    const bf16* src = row_ptr(i);
    unsigned char* d = dst + sw_tile_offset(R, i, c * 8);
    if (src == nullptr) {
      *reinterpret_cast<uint4*>(d) = make_uint4(0, 0, 0, 0);
    } else {
      cp_async<16>(d, src + c * 8);
    }
  }
}

// Rounds a dynamic shared-memory base up to 1024 bytes (launchers add kSwAlignSlack).
constexpr size_t kSwAlignSlack = 1024;
__device__ __forceinline__ unsigned char* sw_align(unsigned char* smem) {
  const uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  return smem + (((a + 1023u) & ~1023u) - a);
}

// Stages of the dense branches' K/V pipeline (TmaKvPipeline). Three measured slower (H100
// workshop: compressed forward m7c_125m 64k 1.10 -> 1.18 ms, paper_attn 16k 1.09 -> 1.14; the
// compressed + window dq 1.64 -> 1.69 and 2.37 -> 2.44).
constexpr int kKvStages = 2;

// Pipeline of KT-row K/V tiles (swizzled) in kKvStages stages for the dense branches, filled by
// the bulk tensor copy engine: thread 0 issues one box per 64-column sub-tile (dense_kv_maps.h) on
// the stage's mbarrier; every thread waits on that barrier, which also publishes the bytes to
// wgmma. Rows past the chunk's keys arrive as whatever follows them (the next sequence's keys, or
// zeros past the tensor): the kernels mask those scores to −inf, so their probabilities are exact
// zeros. Chunk `it` uses stage it % S and barrier phase (it / S) % 2 (S = kKvStages); start(n)
// issues the first S − 1 chunks. Two ways to run it:
// - one barrier per chunk (the forward):
//     start(n); for it: { c = acquire(it); <issue the first product on chunk it>;
//                         prefetch(it, n); <wait, softmax, the chunk's other products> }
//   prefetch loads chunk it + S − 1 into the stage of chunk it − 1, free once every warpgroup
//   has passed acquire(it)'s barrier (each waited for its products on chunk it − 1 before it);
// - dq: start(n); for it: { c = acquire(it, n); ...; release(); } – acquire starts chunk
//   it + S − 1 in the stage that the previous release()'s barrier freed.
// It replaced a pipeline of cp.async copies by all threads, whose address arithmetic and waits
// were a fifth of the forward's stall samples (Nsight Compute, m7c_125m 16k).
template <int DK, int DV, int KT, typename Chunks>
struct TmaKvPipeline {
  static constexpr int S = kKvStages;
  static constexpr uint32_t kKBytes = KT * DK * 2, kVBytes = KT * DV * 2;
  static constexpr size_t kBytes = S * (kKBytes + kVBytes) + kSwAlignSlack;
  unsigned char* buf;  // 1024-byte aligned
  uint64_t* bars;      // one mbarrier per stage
  const CUtensorMap* k_map;
  const CUtensorMap* v_map;
  int32_t group, row0;  // the maps' group and the row of the range's key 0
  Chunks chunks;

  __device__ unsigned char* k(int64_t it) const { return buf + (it % S) * (kKBytes + kVBytes); }
  __device__ unsigned char* v(int64_t it) const { return k(it) + kKBytes; }
  __device__ void issue(int64_t it) const {
    static_assert(DK % 64 == 0 && DV % 64 == 0, "64-column boxes");
    if (threadIdx.x != 0) return;
    uint64_t* bar = bars + it % S;
    const int32_t row = row0 + static_cast<int32_t>(chunks(it).k0);
    mbarrier_expect_bytes(bar, kKBytes + kVBytes);
#pragma unroll
    for (int s = 0; s < DK / 64; ++s) {
      tma_load_box(k(it) + s * KT * 128, k_map, s * 64, group, row, bar);
    }
#pragma unroll
    for (int s = 0; s < DV / 64; ++s) {
      tma_load_box(v(it) + s * KT * 128, v_map, s * 64, group, row, bar);
    }
  }
  __device__ void start(int64_t n) const {
    for (int64_t it = 0; it < S - 1 && it < n; ++it) issue(it);
  }
  __device__ void wait(int64_t it) const {
    mbarrier_wait(bars + it % S, static_cast<uint32_t>((it / S) & 1));
  }
  // The first way: waits for chunk it; the barrier frees the stage of chunk it − 1.
  __device__ KeyChunk acquire(int64_t it) const {
    wait(it);
    __syncthreads();
    return chunks(it);
  }
  __device__ void prefetch(int64_t it, int64_t n) const {
    if (it + S - 1 < n) issue(it + S - 1);
  }
  // The second way: starts chunk it + S − 1, waits for chunk it; release() after its use.
  __device__ KeyChunk acquire(int64_t it, int64_t n) const {
    prefetch(it, n);
    wait(it);
    return chunks(it);
  }
  __device__ void release() const {
    __syncthreads();
  }
};

// Every thread of the block calls it (it ends with a block barrier): the stages' barriers are
// (re)initialised by thread 0 – a kernel may run several ranges one after the other, each after
// the previous one's last release.
template <int DK, int DV, int KT, typename Chunks>
__device__ __forceinline__ TmaKvPipeline<DK, DV, KT, Chunks> make_tma_pipeline(
    unsigned char* smem, const CUtensorMap* k_map, const CUtensorMap* v_map, int64_t group,
    int64_t row0, Chunks chunks) {
  __shared__ uint64_t bars[kKvStages];
  if (threadIdx.x == 0) {
    for (int s = 0; s < kKvStages; ++s) mbarrier_init_one(&bars[s]);
    mbarrier_init_fence();
  }
  __syncthreads();
  return {
      sw_align(smem), bars, k_map, v_map, static_cast<int32_t>(group), static_cast<int32_t>(row0),
      chunks};
}

// The K/V pipeline of a dense-branch kernel (N threads) over the keys [keys.begin, keys.end) of
// branch B, sequence n, group g, in chunks of KT rows: swizzled tiles by TMA for wgmma (`maps`
// from make_dense_kv_maps), padded tiles by cp.async for mma.sync. n_key_chunks gives the chunk
// count.
template <int DK, int DV, int KT, bool kWgmma, int N, Branch B>
__device__ __forceinline__ auto dense_pipeline(unsigned char* smem, const NsaParams& p,
                                               const DenseKvMaps& maps, int64_t n, int64_t g,
                                               KeyRange keys) {
  const auto chunks = [keys](int64_t it) {
    const int64_t k0 = keys.begin + it * KT;
    return KeyChunk{k0, keys.end - k0 < KT ? keys.end - k0 : KT};
  };
  if constexpr (kWgmma) {
    constexpr int i = dense_map_index(B);
    const int64_t row0 = B == Branch::kCmp ? p.cmp_offsets[n] : p.cu_seqlens[n];
    return make_tma_pipeline<DK, DV, KT>(smem, &maps.k[i], &maps.v[i], g, row0, chunks);
  } else {
    return make_pipeline<DK, DV, KT, false>(smem, branch_rows<B>(p, n, g), chunks);
  }
}
__device__ __forceinline__ int64_t n_key_chunks(KeyRange keys, int KT) {
  return (keys.end - keys.begin + KT - 1) / KT;
}

// s (64 × KT, this warp's 16 rows as s[KT/8][4]) = A·Yᵀ: a the warp's A fragments (16 rows × D,
// e.g. Q), y a KT-row swizzled tile of D columns (e.g. K). Issues the products only; the caller
// fences before and commits and waits after (wgmma_a_bt does all).
template <int D, int KT>
__device__ __forceinline__ void wgmma_a_bt_issue(float s[][4], const uint32_t a[][4],
                                                 const unsigned char* y) {
  const uint64_t dy = sw128_tile_desc(y);
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
#pragma unroll
    for (int nb = 0; nb < KT / 64; ++nb) {
      const uint32_t off = (kk / 4) * KT * 128 + nb * 64 * 128 + 32 * (kk % 4);
      wgmma_m64n64k16_rs(&s[nb * 8][0], a[kk], desc_at(dy, off), kk > 0);
    }
  }
}
// The same with A a 64-row swizzled tile of D columns in shared memory (both operands shared: the
// A fragments need no registers).
template <int D, int KT>
__device__ __forceinline__ void wgmma_tile_bt_issue(float s[][4], const unsigned char* a,
                                                    const unsigned char* y) {
  const uint64_t da = sw128_tile_desc(a), dy = sw128_tile_desc(y);
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
#pragma unroll
    for (int nb = 0; nb < KT / 64; ++nb) {
      wgmma_m64n64k16_ss(&s[nb * 8][0], desc_at(da, (kk / 4) * 64 * 128 + 32 * (kk % 4)),
                         desc_at(dy, (kk / 4) * KT * 128 + nb * 64 * 128 + 32 * (kk % 4)), kk > 0);
    }
  }
}
template <int D, int KT>
__device__ __forceinline__ void wgmma_a_bt(float s[][4], const uint32_t a[][4],
                                           const unsigned char* y) {
  wgmma_fence();
  wgmma_a_bt_issue<D, KT>(s, a, y);
  wgmma_commit();
  wgmma_wait<0>();
}

// o (64 × DV) += P·V: a the warp's 16 × KT probabilities (or dS) as A fragments (c_to_a of the s
// of wgmma_a_bt), vt a KT-row swizzled tile of DV columns (V, or K for dq; MN-major B). Issues
// the products only (see wgmma_a_bt_issue).
template <int DV, int KT>
__device__ __forceinline__ void wgmma_p_v_issue(float o[][4], const uint32_t a[][4],
                                                const unsigned char* vt) {
  const uint64_t dv = sw128_tile_desc(vt);
#pragma unroll
  for (int kk = 0; kk < KT / 16; ++kk) {
#pragma unroll
    for (int nb = 0; nb < DV / 64; ++nb) {
      wgmma_m64n64k16_rs<true>(&o[nb * 8][0], a[kk], desc_at(dv, nb * KT * 128 + 16 * 128 * kk),
                               true);
    }
  }
}
// A fragments of the warp's 16 × KT C-layout values p.
template <int KT>
__device__ __forceinline__ void c_to_a_tile(uint32_t a[][4], const float p[][4]) {
#pragma unroll
  for (int kk = 0; kk < KT / 16; ++kk) c_to_a(a[kk], p[2 * kk], p[2 * kk + 1]);
}
// o += P·V with p in the C layout, waiting for the product.
template <int DV, int KT>
__device__ __forceinline__ void wgmma_p_v(float o[][4], const float p[][4],
                                          const unsigned char* vt) {
  uint32_t a[KT / 16][4];
  c_to_a_tile<KT>(a, p);
  wgmma_fence();
  wgmma_p_v_issue<DV, KT>(o, a, vt);
  wgmma_commit();
  wgmma_wait<0>();
}

}  // namespace nsa::cuda
