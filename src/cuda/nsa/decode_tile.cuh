// One part of decode attention (decode_params.cuh): the group's hpg ≤ 16 heads against up to
// kPartKeys keys staged in shared memory, on the tensor cores – the heads are the 16 rows of
// m16n8k16 tiles (rows ≥ hpg are zeros and ignored), or for hpg ≤ 8 at dk = dv = 64 the scores are
// Sᵀ = K·Qᵀ, keys as rows and heads as the 8 columns. Each warp attends its own 32 keys (S = Q·Kᵀ,
// softmax, O = P·V with P in registers, bf16 as the training forward) and the four partials fold
// after one barrier. A part issues every load it needs (q, key and value rows, cp.async) before it
// waits for any: one memory round trip.
#pragma once

#include <cfloat>
#include <type_traits>

#include "common/fast_exp.cuh"
#include "common/mma.cuh"
#include "common/tma.cuh"
#include "decode_params.cuh"

namespace nsa::cuda::decode {

// The staged tile: q [16, dk], keys [kPartKeys, dk] and values [kPartKeys, dv] (bf16). q and the
// values have padded rows (mma.cuh's tile_stride) so that the fragment loads are free of bank
// conflicts; the keys are packed and swizzled instead (key_piece), which saves the 2 KiB of
// padding that decides the occupancy: 36 KiB at dk = dv = 64, six part CTAs per SM (five with
// padded keys). The warps' partial outputs take their value rows once read (partial_at).
struct Tile {
  bf16 *q, *k, *v;
  int qs, vs;  // row strides in elements
  int nk;      // 16-byte pieces of a key row (dk / 8)
  int kphase;  // the keys' swizzle phase: 0, or the copy engine's (carve_tile_aligned64)
};

// Where piece j (8 bf16) of key row c lies among the packed keys' pieces, nk = dk / 8 to a row: the
// piece's index i = c·nk + j with its low three bits XOR-ed by the key row's (nk a multiple of 8)
// or else by its 128-byte line's (i / 8) – a permutation within each line, under which the eight
// rows of a fragment load (the same j) fall on eight different 16-byte bank groups when nk is a
// power of two (dk = 16, 32, 64, 128, 256). No division: this runs for every piece. `phase` (nk a
// multiple of 8) shifts the rows' XOR: the copy engine's 128-byte swizzle XORs a piece's address
// bits 4–6 with bits 7–9, so keys starting `phase` 128-byte lines past a 1024-byte boundary land
// with row c XOR-ed by (c + phase) mod 8.
__host__ __device__ __forceinline__ constexpr int key_piece(int c, int j, int nk, int phase = 0) {
  const int i = c * nk + j;
  return i ^ (((nk & 7) == 0 ? c + phase : i >> 3) & 7);
}

// Checked at compile time for every dk the decoder takes (nk even, 2 .. 32): key_piece permutes the
// tile's pieces, and for nk a power of two the eight rows c0 .. c0 + 7 (c0 a multiple of 8) of any
// piece j lie in eight different bank groups (piece index mod 8).
constexpr bool key_piece_checks(int nk) {
  bool seen[kPartKeys * 32] = {};
  for (int c = 0; c < kPartKeys; ++c) {
    for (int j = 0; j < nk; ++j) {
      const int i = key_piece(c, j, nk);
      if (i < 0 || i >= kPartKeys * nk || seen[i]) return false;
      seen[i] = true;
    }
  }
  if ((nk & (nk - 1)) != 0) return true;
  for (int c0 = 0; c0 < kPartKeys; c0 += 8) {
    for (int j = 0; j < nk; ++j) {
      int groups = 0;
      for (int r = 0; r < 8; ++r) groups |= 1 << (key_piece(c0 + r, j, nk) & 7);
      if (groups != 0xff) return false;
    }
  }
  return true;
}
static_assert(
    [] {
      for (int nk = 2; nk <= 32; nk += 2)
        if (!key_piece_checks(nk)) return false;
      return true;
    }(),
    "key_piece must permute the keys' pieces, conflict-free for power-of-two dk / 8");

__device__ __forceinline__ bf16* key_at(const Tile& tl, int c, int j) {
  return tl.k + 8 * key_piece(c, j, tl.nk, tl.kphase);
}

__host__ __device__ constexpr size_t tile_key_bytes(int dk) {
  return sizeof(bf16) * static_cast<size_t>(kPartKeys) * dk;
}

__host__ __device__ constexpr size_t tile_bytes(int dk, int dv) {
  return sizeof(bf16) * static_cast<size_t>(kMaxHeadsPerGroup) * tile_stride(dk) +
         tile_key_bytes(dk) + sizeof(bf16) * static_cast<size_t>(kPartKeys) * tile_stride(dv);
}

// Carves the tile out of dynamic shared memory at `base` (16-byte aligned; every piece is a
// multiple of 16 bytes).
__device__ __forceinline__ Tile carve_tile(unsigned char* base, int dk, int dv) {
  Tile t;
  t.qs = tile_stride(dk), t.vs = tile_stride(dv), t.nk = dk / 8, t.kphase = 0;
  t.q = reinterpret_cast<bf16*>(base);
  unsigned char* keys = base + sizeof(bf16) * kMaxHeadsPerGroup * t.qs;
  t.k = reinterpret_cast<bf16*>(keys);
  t.v = reinterpret_cast<bf16*>(keys + tile_key_bytes(dk));
  return t;
}

// The tile of a part whose cache rows the copy engine brings (d_k = d_v = kTmaHeadDim;
// nsa_decode.cu): the keys first, at the next 128-byte boundary (a box's destination; under the
// 128-byte swizzle a box of 64-column key rows lands in key_piece's order with the phase of that
// boundary within its 1024 bytes, tests/cuda/test_tma_boxes.cu), the values next (a box 72 columns
// wide: the padded rows), q last. `base` needs tile_bytes(64, 64) + kTileAlignSlack bytes. The
// slack is at most 112 bytes (the base is 16-byte aligned), not the 1,008 of a 1024-byte boundary:
// that is what keeps a parts CTA at six an SM (docs/perf.md).
constexpr int kTmaHeadDim = 64, kTileAlignSlack = 112;
__device__ __forceinline__ Tile carve_tile_aligned64(unsigned char* base) {
  const uint32_t at = static_cast<uint32_t>(__cvta_generic_to_shared(base));
  const uint32_t pad = (128u - at % 128u) % 128u;
  unsigned char* keys = base + pad;
  Tile t;
  t.qs = tile_stride(kTmaHeadDim), t.vs = tile_stride(kTmaHeadDim), t.nk = kTmaHeadDim / 8;
  t.kphase = static_cast<int>(((at + pad) >> 7) & 7u);
  t.k = reinterpret_cast<bf16*>(keys);
  t.v = reinterpret_cast<bf16*>(keys + tile_key_bytes(kTmaHeadDim));
  t.q = t.v + kPartKeys * t.vs;
  return t;
}

// The bytes of `rows` cache rows brought by tile_issue_row_boxes: keys of kTmaHeadDim columns and
// the padded value rows.
__device__ __forceinline__ uint32_t row_boxes_bytes(int rows) {
  return static_cast<uint32_t>(rows * (kTmaHeadDim + tile_stride(kTmaHeadDim)) * sizeof(bf16));
}

// One thread: a key box and a value box (NsaDecodeCuda's maps: make_row_box_map over a cache's
// rows of one group each, keys swizzled, values 72 columns wide – the 8 past the row are zeros)
// from map row `at` ((b·G + g)·rows + r) on into the tile from row r0 on (carve_tile_aligned64's),
// completing on `bar` – the parts' and the picks' TMA rows.
__device__ __forceinline__ void tile_issue_row_boxes(const Tile& tl, int r0, const CUtensorMap* k,
                                                     const CUtensorMap* v, int32_t at,
                                                     uint64_t* bar) {
  tma_load_box_2d(tl.k + r0 * kTmaHeadDim, k, 0, at, bar);
  tma_load_box_2d(tl.v + r0 * tl.vs, v, 0, at, bar);
}

// Starts copying the group's q rows ([hpg, dk] bf16, contiguous in q [B, H, dk]); rows hpg .. 15
// are zeroed.
__device__ __forceinline__ void tile_issue_q(const DecodeDims& m, const bf16* q, int b, int g,
                                             const Tile& tl) {
  const bf16* src = q + (static_cast<int64_t>(b) * m.G * m.hpg + g * m.hpg) * m.dk;
  const int n8 = m.dk / 8;
  for (int i = threadIdx.x; i < kMaxHeadsPerGroup * n8; i += blockDim.x) {
    const int r = i / n8, c8 = i % n8;
    bf16* dst = tl.q + r * tl.qs + 8 * c8;
    if (r < m.hpg) {
      cp_async<16>(dst, src + r * m.dk + 8 * c8);
    } else {
      *reinterpret_cast<uint4*>(dst) = make_uint4(0, 0, 0, 0);
    }
  }
}

// Calls f(c, j) for this thread's pieces i = threadIdx.x, + blockDim.x, … < n·per of n rows of
// `per` pieces each (row c = i / per, piece j = i mod per), stepping c and j without a division.
template <typename F>
__device__ __forceinline__ void for_each_piece(int n, int per, F&& f) {
  const int dc = blockDim.x / per, dj = blockDim.x % per;
  int c = threadIdx.x / per, j = threadIdx.x % per;
  while (c < n) {
    f(c, j);
    c += dc, j += dj;
    if (j >= per) j -= per, ++c;
  }
}

// Starts copying `n` key and value rows that lie at a fixed stride in a cache (row c of the part at
// k_first + c·k_stride, v_first + c·v_stride) – the parts whose rows do not depend on the position.
// Rows past the part's real count are fixed afterwards (tile_fix_rows).
__device__ __forceinline__ void tile_issue_rows(const DecodeDims& m, const Tile& tl, int n,
                                                const bf16* k_first, const bf16* v_first,
                                                int64_t k_stride, int64_t v_stride) {
  const int nk = m.dk / 8, nv = m.dv / 8;
  for_each_piece(n, nk + nv, [&](int c, int j) {
    if (j < nk) {
      cp_async<16>(key_at(tl, c, j), k_first + c * k_stride + 8 * j);
    } else {
      cp_async<16>(tl.v + c * tl.vs + 8 * (j - nk), v_first + c * v_stride + 8 * (j - nk));
    }
  });
}

// One 16-byte piece of the token's key row (pieces 0 .. dk/8 − 1) and value row (the next dv/8)
// per thread, loaded before the position is known: the part may hold position t, whose row is not
// in the caches yet.
__device__ __forceinline__ uint4 load_input_piece(const DecodeDims& m, const bf16* k_in,
                                                  const bf16* v_in) {
  const int nk = m.dk / 8, j = threadIdx.x;
  if (j < nk) return reinterpret_cast<const uint4*>(k_in)[j];
  if (j < nk + m.dv / 8) return reinterpret_cast<const uint4*>(v_in)[j - nk];
  return make_uint4(0, 0, 0, 0);
}

// After the issued rows landed (and a barrier): zeroes rows count .. round16(count) − 1, which the
// MMAs read (a value row of junk could hold a NaN, and 0 · NaN is NaN), and writes the token's
// pieces into row `patch` (if ≥ 0). A barrier must follow.
__device__ __forceinline__ void tile_fix_rows(const DecodeDims& m, const Tile& tl, int count,
                                              int patch, uint4 piece) {
  const int nk = m.dk / 8, nv = m.dv / 8, per = nk + nv;
  const auto at = [&](int c, int j) {
    return reinterpret_cast<uint4*>(j < nk ? key_at(tl, c, j) : tl.v + c * tl.vs + 8 * (j - nk));
  };
  for_each_piece(round16(count) - count, per,
                 [&](int c, int j) { *at(count + c, j) = make_uint4(0, 0, 0, 0); });
  if (patch >= 0 && threadIdx.x < per) *at(patch, threadIdx.x) = piece;
}

// The source rows of a part's keys where they follow no stride (picked blocks): key c is
// k[c] / v[c], filled by the caller (one thread per key) before a barrier.
struct KeyRows {
  const bf16* k[kPartKeys];
  const bf16* v[kPartKeys];
};

// Starts copying keys 0 .. count − 1 from `rows` and zeroes the rows count .. round16(count) − 1
// (as tile_fix_rows).
__device__ __forceinline__ void tile_issue_kv(const DecodeDims& m, const Tile& tl,
                                              const KeyRows& rows, int count) {
  const int nk = m.dk / 8, nv = m.dv / 8;
  for_each_piece(count, nk + nv, [&](int c, int j) {
    if (j < nk) {
      cp_async<16>(key_at(tl, c, j), rows.k[c] + 8 * j);
    } else {
      cp_async<16>(tl.v + c * tl.vs + 8 * (j - nk), rows.v[c] + 8 * (j - nk));
    }
  });
  tile_fix_rows(m, tl, count, -1, make_uint4(0, 0, 0, 0));
}

// mma.cuh's load_b_rows_x2 on the swizzled keys: B fragments of the key tiles n0 and n0 + 8 at the
// 16 columns from k0 (lanes 8m .. 8m + 7 give the rows of matrix m: keys n0 + 8·(m / 2) + r, piece
// k0 / 8 + m mod 2).
__device__ __forceinline__ void load_key_fragments(uint32_t b[4], const Tile& tl, int n0, int k0) {
  const int lane = threadIdx.x & 31, m = lane >> 3, r = lane & 7;
  ldmatrix_x4(b, key_at(tl, n0 + (m >> 1) * 8 + r, (k0 >> 3) + (m & 1)));
}

// Each warp attends its own kWarpKeys keys (kWarpTiles tiles of 16) and leaves a partial softmax
// per head; the CTA meets once, to fold the four partials.
constexpr int kTileWarps = kPartThreads / 32;
constexpr int kWarpKeys = kPartKeys / kTileWarps;
constexpr int kWarpTiles = kWarpKeys / 16;
static_assert(kWarpKeys % 16 == 0, "a warp's keys are whole 16-key tiles");

// S = Q·Kᵀ for the warp's tiles (keys key0 + 16·t), every tile: a tile past the part's keys holds
// stale rows, whose scores the softmax masks (a select, so that not even a NaN gets through). With
// d_k fixed (kDk > 0) the loops unroll and every fragment of a 64-column chunk is loaded before its
// first MMA: one shared-memory round trip and 2·kWarpTiles independent MMA chains; with d_k read at
// run time, a 16-column step at a time.
template <int kDk>
__device__ __forceinline__ void warp_scores(const Tile& tl, int dk, int key0,
                                            float (&s)[kWarpTiles][8]) {
#pragma unroll
  for (int t = 0; t < kWarpTiles; ++t) {
#pragma unroll
    for (int e = 0; e < 8; ++e) s[t][e] = 0.0f;
  }
  if constexpr (kDk > 0) {
#pragma unroll
    for (int kb = 0; kb < kDk; kb += 64) {
      uint32_t a[4][4], b[kWarpTiles][4][4];
#pragma unroll
      for (int st = 0; st < 4 && kb + 16 * st < kDk; ++st) {
        load_a(a[st], tl.q, tl.qs, 0, kb + 16 * st);
#pragma unroll
        for (int t = 0; t < kWarpTiles; ++t)
          load_key_fragments(b[t][st], tl, key0 + 16 * t, kb + 16 * st);
      }
#pragma unroll
      for (int st = 0; st < 4 && kb + 16 * st < kDk; ++st) {
#pragma unroll
        for (int t = 0; t < kWarpTiles; ++t) {
          mma_16816(s[t], a[st], b[t][st]);
          mma_16816(s[t] + 4, a[st], b[t][st] + 2);
        }
      }
    }
  } else {
    for (int k0 = 0; k0 < dk; k0 += 16) {
      uint32_t a[4], b[kWarpTiles][4];
      load_a(a, tl.q, tl.qs, 0, k0);
#pragma unroll
      for (int t = 0; t < kWarpTiles; ++t) load_key_fragments(b[t], tl, key0 + 16 * t, k0);
#pragma unroll
      for (int t = 0; t < kWarpTiles; ++t) {
        mma_16816(s[t], a, b[t]);
        mma_16816(s[t] + 4, a, b[t] + 2);
      }
    }
  }
}

// Sᵀ = K·Qᵀ for the warp's tiles where the group has at most 8 heads (m7c: 6): the keys are the
// 16 rows of an m16n8k16 tile and the heads its 8 columns, so a 16-key tile takes one MMA a k step
// instead of two (rows 8 .. 15 of S = Q·Kᵀ were zeros), and the softmax has 4 scores a thread and
// tile instead of 8. Thread (gid, tq) of tile t holds keys key0 + 16·t + gid (s[t][0..1]) and
// + 8 (s[t][2..3]) of heads 2·tq and 2·tq + 1 (C fragment). Every fragment is loaded before the
// first MMA, as warp_scores does.
template <int kDk>
__device__ __forceinline__ void warp_scores_narrow(const Tile& tl, int key0,
                                                   float (&s)[kWarpTiles][4]) {
  static_assert(kDk % 32 == 0, "q's fragments come 32 columns a load");
  constexpr int kSteps = kDk / 16;
  const int lane = threadIdx.x & 31, m = lane >> 3, r = lane & 7;
  uint32_t bq[kSteps][2], a[kWarpTiles][kSteps][4];
#pragma unroll
  for (int st = 0; st < kSteps; st += 2) {  // Qᵀ: heads 0 .. 7, columns 16·st .. 16·st + 31
    uint32_t x[4];
    ldmatrix_x4(x, tl.q + r * tl.qs + 16 * st + 8 * m);
    bq[st][0] = x[0], bq[st][1] = x[1], bq[st + 1][0] = x[2], bq[st + 1][1] = x[3];
  }
#pragma unroll
  for (int t = 0; t < kWarpTiles; ++t) {
#pragma unroll
    for (int st = 0; st < kSteps; ++st)  // matrix m: keys + 8·(m mod 2), piece 2·st + m / 2
      ldmatrix_x4(a[t][st], key_at(tl, key0 + 16 * t + (m & 1) * 8 + r, 2 * st + (m >> 1)));
  }
#pragma unroll
  for (int t = 0; t < kWarpTiles; ++t) {
    s[t][0] = s[t][1] = s[t][2] = s[t][3] = 0.0f;
#pragma unroll
    for (int st = 0; st < kSteps; ++st) mma_16816(s[t], a[t][st], bq[st]);
  }
}

// Where a warp leaves its partial output: in its own value rows, which no other warp reads, 16
// value columns at a time – head h's outputs e = 16·g .. 16·g + 15 (fp32, 64 bytes) take columns
// 16·g .. 16·g + 15 of value rows key0 + 2h (e mod 16 < 8) and key0 + 2h + 1 (the rest), the
// bytes of the values they are made of, once the warp has read them.
__device__ __forceinline__ float* partial_at(const Tile& tl, int key0, int h, int e) {
  const int upper = (e >> 3) & 1;
  return reinterpret_cast<float*>(tl.v + (key0 + 2 * h + upper) * tl.vs + (e & ~15)) + (e & 7);
}

// Stores a 16-column group's outputs (C fragments c0: columns n0 .. n0 + 7, c1: n0 + 8 ..) of the
// heads < hpg at partial_at.
__device__ __forceinline__ void store_partial(const Tile& tl, int hpg, int key0, int n0,
                                              const float c0[4], const float c1[4]) {
  const int lane = threadIdx.x & 31, gid = lane >> 2, e = n0 + 2 * (lane & 3);
  if (gid < hpg) {
    *reinterpret_cast<float2*>(partial_at(tl, key0, gid, e)) = make_float2(c0[0], c0[1]);
    *reinterpret_cast<float2*>(partial_at(tl, key0, gid, e + 8)) = make_float2(c1[0], c1[1]);
  }
  if (gid + 8 < hpg) {
    *reinterpret_cast<float2*>(partial_at(tl, key0, gid + 8, e)) = make_float2(c0[2], c0[3]);
    *reinterpret_cast<float2*>(partial_at(tl, key0, gid + 8, e + 8)) = make_float2(c1[2], c1[3]);
  }
}

// O = P·V over the warp's key tiles t < tiles (P: the A fragments pa), left at partial_at. With d_v
// fixed (kDv > 0) a tile's value fragments are all loaded before its MMAs and the partial is
// stored at the end; with d_v read at run time, 16 columns at a time, each group's partial stored
// over the group's own (read) columns.
template <int kDv>
__device__ __forceinline__ void warp_values(const Tile& tl, int dv, int hpg, int key0, int tiles,
                                            const uint32_t (&pa)[kWarpTiles][4]) {
  if constexpr (kDv > 0) {
    constexpr int kGroups = kDv / 16;
    float c[2 * kGroups][4];
#pragma unroll
    for (int j = 0; j < 2 * kGroups; ++j) c[j][0] = c[j][1] = c[j][2] = c[j][3] = 0.0f;
#pragma unroll
    for (int t = 0; t < kWarpTiles; ++t) {
      if (t >= tiles) break;
      uint32_t v[kGroups][4];
#pragma unroll
      for (int g = 0; g < kGroups; ++g) load_b_cols_x2(v[g], tl.v, tl.vs, key0 + 16 * t, 16 * g);
#pragma unroll
      for (int g = 0; g < kGroups; ++g) {
        mma_16816(c[2 * g], pa[t], v[g]);
        mma_16816(c[2 * g + 1], pa[t], v[g] + 2);
      }
    }
    __syncwarp();  // the values are read: the partial may take their place
#pragma unroll
    for (int g = 0; g < kGroups; ++g) store_partial(tl, hpg, key0, 16 * g, c[2 * g], c[2 * g + 1]);
  } else {
    for (int n0 = 0; n0 < dv; n0 += 16) {
      float c0[4] = {0.0f, 0.0f, 0.0f, 0.0f}, c1[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
      for (int t = 0; t < kWarpTiles; ++t) {
        if (t >= tiles) break;
        uint32_t v[4];
        load_b_cols_x2(v, tl.v, tl.vs, key0 + 16 * t, n0);
        mma_16816(c0, pa[t], v);
        mma_16816(c1, pa[t], v + 2);
      }
      __syncwarp();  // the group's values are read
      store_partial(tl, hpg, key0, n0, c0, c1);
    }
  }
}

// The warps' (max, sum) per head, in shared memory – one array for every tile_attend instance (a
// static array in the template would be one per instance, and the parts kernel's shared memory
// one CTA per multiprocessor short: docs/perf.md, twenty-sixth session).
__device__ __forceinline__ float2 (*warp_ml_table())[kMaxHeadsPerGroup] {
  __shared__ float2 table[kTileWarps][kMaxHeadsPerGroup];
  return table;
}

// The two layouts of a warp's scores in tile_attend, per tile t and register e of a thread
// (gid, tq): which key (lane_key + tile_key, from the warp's first key) and which of the thread's
// two heads (slot; head) the score is, how a head's max and sum meet across lanes, and how P
// becomes the A fragments of O = P·V (P's rows are the heads).
// HeadRows: S = Q·Kᵀ, the heads the 16 rows of the C fragments – 8 scores a thread and tile; a
// head's scores meet in its quad (two shuffles), P's fragments are S's C fragments (c_to_a).
struct HeadRows {
  static constexpr int kPerTile = 8;
  __device__ static int lane_key(int, int tq) { return 2 * tq; }
  __device__ static constexpr int tile_key(int t, int e) {
    return 16 * t + (e >= 4 ? 8 : 0) + (e & 1);
  }
  __device__ static constexpr int slot(int e) { return (e >> 1) & 1; }
  __device__ static int head(int gid, int, int r) { return gid + 8 * r; }
  __device__ static float head_max(float x) { return quad_max(x); }
  __device__ static float head_sum(float x) { return quad_sum(x); }
  __device__ static void to_a(uint32_t a[4], float (&s)[kPerTile]) { c_to_a(a, s, s + 4); }
  __device__ static bool writes_stats(int, int tq) { return tq == 0; }
};
// HeadColumns: Sᵀ = K·Qᵀ (warp_scores_narrow), the heads the 8 columns – 4 scores a thread and
// tile; a head's scores meet in the 8 lanes of its column (three shuffles), and each 8 × 8 block
// of P (keys 0 .. 7 and 8 .. 15 of the tile) is transposed into an A fragment by movmatrix; heads
// 8 .. 15 are zeros.
struct HeadColumns {
  static constexpr int kPerTile = 4;
  __device__ static int lane_key(int gid, int) { return gid; }
  __device__ static constexpr int tile_key(int t, int e) { return 16 * t + 8 * (e >> 1); }
  __device__ static constexpr int slot(int e) { return e & 1; }
  __device__ static int head(int, int tq, int r) { return 2 * tq + r; }
  __device__ static float head_max(float x) { return column_max(x); }
  __device__ static float head_sum(float x) { return column_sum(x); }
  __device__ static void to_a(uint32_t a[4], float (&s)[kPerTile]) {
    a[0] = movmatrix_trans(pack_bf16(s[0], s[1]));
    a[2] = movmatrix_trans(pack_bf16(s[2], s[3]));
    a[1] = a[3] = 0u;
  }
  __device__ static bool writes_stats(int gid, int) { return gid == 0; }
};

// What a compressed part leaves the top-n kernel (decode_params.cuh): with `scores`, the scaled
// score of head h, key c at scores[h·stride + c]; with `sums` (the narrow layout only: hpg ≤ 8 and
// d_k = d_v = 64, where the decoder takes the block sums' path), head 0's block-sums row
// (block_sums_row) of the part's (sequence, group), the part's keys from `first` on (a multiple of
// 32: a warp's keys are whole quartets). Neither: the part is not compressed.
struct ScoresOut {
  float* scores = nullptr;
  int64_t stride = 0;
  float* sums = nullptr;
  int first = 0;
};

// Whether a part's scores are computed as Sᵀ = K·Qᵀ (HeadColumns): the heads fit the 8 columns
// and the head dims are compiled in.
__host__ __device__ constexpr bool narrow_scores(int dk, int dv, int hpg) {
  return dk == 64 && dv == 64 && hpg <= 8;
}

// A warp's quartet sums (decode_params.cuh, "The block sums") from its probabilities p = s[t][e]
// (HeadColumns: key key0 + 16t + 8·(e / 2) + gid, head 2·tq + e mod 2): the four keys of a quartet
// are the lanes r = gid mod 4 = 0 .. 3 of one (gid / 4, tq). Their weighted terms x (½·p at r = 3)
// of the thread's 8 values meet by halving exchanges – 4 values over lane bit 2, then 2 over lane
// bit 3 – so that each of the four lanes ends with the sums A of 2 values, t = r mod 2, e / 2 =
// r / 2 (6 shuffles, coalesced stores); lane 3 writes its own terms B. The code runs once per CTA
// at batch 1, where its size costs instruction fetches (docs/perf.md).
template <int kTiles>
__device__ __forceinline__ void write_quartets(const DecodeDims& m, const ScoresOut& out, int key0,
                                               const float (&s)[kTiles][4]) {
  static_assert(kTiles == 2, "the exchanges take a warp's two 16-key tiles");
  const unsigned all = 0xffffffffu;
  const int lane = threadIdx.x & 31, gid = lane >> 2, tq = lane & 3, r = gid & 3;
  const bool b0 = r & 1, b1 = r >> 1;
  const int64_t row = block_sums_floats(m.sums_q);
  const float w = r == 3 ? 0.5f : 1.0f;
  float x[8];  // value i = 4t + e
#pragma unroll
  for (int i = 0; i < 8; ++i) x[i] = w * s[i / 4][i % 4];
  float y[4], z[2];
#pragma unroll
  for (int k = 0; k < 4; ++k)  // y[k]: value k + 4·b0 over lanes r and r ^ 1
    y[k] = (b0 ? x[k + 4] : x[k]) + __shfl_xor_sync(all, b0 ? x[k] : x[k + 4], 4);
#pragma unroll
  for (int k = 0; k < 2; ++k)  // z[k]: value k + 2·b1 + 4·b0 over the four lanes: head 2·tq + k
    z[k] = (b1 ? y[k + 2] : y[k]) + __shfl_xor_sync(all, b1 ? y[k] : y[k + 2], 8);
  const int q0 = (out.first + key0) / 4 + gid / 4;  // the lane's first quartet (t = 0, e / 2 = 0)
  float* head0 = out.sums + 2 * tq * row;
  if (2 * tq < m.hpg) head0[q0 + 4 * b0 + 2 * b1] = z[0];
  if (2 * tq + 1 < m.hpg) head0[row + q0 + 4 * b0 + 2 * b1] = z[1];
  if (r == 3) {
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      if (2 * tq + (i & 1) < m.hpg)
        head0[(i & 1) * row + m.sums_q + q0 + (i / 4) * 4 + (i & 2)] = x[i];
    }
  }
}

// The block sums' warp maxes of heads 2·tq and 2·tq + 1 (HeadColumns; mx raw scores, −FLT_MAX for
// no keys), in natural units of the scaled scores.
__device__ __forceinline__ void write_warp_max(const DecodeDims& m, const ScoresOut& out, int key0,
                                               int tq, const float (&mx)[2]) {
  const int64_t row = block_sums_floats(m.sums_q);
  float* at = out.sums + 2 * tq * row + 2 * m.sums_q + (out.first + key0) / 32;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (2 * tq + r < m.hpg) at[r * row] = mx[r] > -FLT_MAX ? mx[r] * m.scale : -FLT_MAX;
  }
}

// tile_attend's phase hook: called by every thread after S = Q·Kᵀ (1) and after the warp's partial
// is written (2); the decoder's does nothing, the workshop's (nsa_decode_tile) reads the clock.
struct NoStamps {
  __device__ __forceinline__ void operator()(int) const {}
};

// The attention of the staged part (its loads landed and a barrier passed): per head h < hpg the
// part's max and sum of exp (ml[2h], ml[2h + 1], fp32) and its unnormalised output o[h·dv + e]
// (8-byte aligned; global or shared memory); and what `out` asks for (ScoresOut). count ≥ 1. Every
// thread of the CTA calls it; a barrier must follow before the tile is staged again. kDk, kDv > 0
// compile it for those head dims (tile_attend_part picks).
//
// Each warp takes its own 32 keys through S = Q·Kᵀ, a softmax over them (a head's max and sum meet
// in the lanes that hold it) and O = P·V with P straight from the S registers, and leaves (max,
// sum, O); after one barrier the warps' partials fold in warp order (docs/perf.md, twenty-sixth
// session: this replaced a softmax over the whole part, whose cross-warp max and P staged in
// shared memory cost two more barriers and a round trip). The scores' layout is HeadRows, or with
// kNarrow (hpg ≤ 8, d_k and d_v compiled in) HeadColumns – Sᵀ, one MMA a 16-key tile and k step
// and half the exponentials.
template <int kDk, int kDv, bool kNarrow = false, bool kScores = true, typename Stamps = NoStamps>
__device__ __forceinline__ void tile_attend(const DecodeDims& m, const Tile& tile, int count,
                                            const ScoresOut& out, float* ml, float* o,
                                            Stamps stamp = {}) {
  static_assert(!kNarrow || (kDk > 0 && kDv > 0), "the narrow layout is for compiled head dims");
  float2(*warp_ml)[kMaxHeadsPerGroup] = warp_ml_table();  // (max, sum) of each warp's keys
  const int dk = kDk > 0 ? kDk : m.dk, dv = kDv > 0 ? kDv : m.dv;
  Tile tl = tile;  // the strides as constants where the dims are
  tl.qs = tile_stride(dk), tl.vs = tile_stride(dv), tl.nk = dk / 8;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, gid = lane / 4, tq = lane % 4;
  const int key0 = warp * kWarpKeys;
  // The warp's tiles that hold keys (rows count .. round16(count) − 1 are zeros).
  const int tiles = min(kWarpTiles, max(0, (round16(count) - key0) / 16));
  const float c2 = m.scale * kLog2e;
  using Layout = std::conditional_t<kNarrow, HeadColumns, HeadRows>;
  float s[kWarpTiles][Layout::kPerTile];
  if constexpr (kNarrow) {
    warp_scores_narrow<kDk>(tl, key0, s);
  } else {
    warp_scores<kDk>(tl, dk, key0, s);
  }
  stamp(1);
  // Keys ≥ count are masked to −FLT_MAX; each head's max meets in its lanes, then
  // p = 2^(s·c2 − max·c2) (c2 = scale·log2 e: one FMA and one MUFU.EX2 a score), whose masked
  // scores come to 2^(−huge) = 0 – also for a head without keys (max −FLT_MAX, bias 0), which ends
  // with sum 0 and a partial of zeros.
  const int lim = count - key0 - Layout::lane_key(gid, tq);
  const auto valid = [&](int t, int e) { return Layout::tile_key(t, e) < lim; };
  float mx[2] = {-FLT_MAX, -FLT_MAX};
#pragma unroll
  for (int t = 0; t < kWarpTiles; ++t) {
#pragma unroll
    for (int e = 0; e < Layout::kPerTile; ++e) {
      s[t][e] = valid(t, e) ? s[t][e] : -FLT_MAX;
      mx[Layout::slot(e)] = fmaxf(mx[Layout::slot(e)], s[t][e]);
    }
  }
  mx[0] = Layout::head_max(mx[0]), mx[1] = Layout::head_max(mx[1]);
  if (kScores && out.scores) {
    const int lane_key = key0 + Layout::lane_key(gid, tq);
#pragma unroll
    for (int t = 0; t < kWarpTiles; ++t) {
#pragma unroll
      for (int e = 0; e < Layout::kPerTile; ++e) {
        const int h = Layout::head(gid, tq, Layout::slot(e));
        if (valid(t, e) && h < m.hpg)
          out.scores[h * out.stride + lane_key + Layout::tile_key(t, e)] = s[t][e] * m.scale;
      }
    }
  }
  const float bias[2] = {mx[0] > -FLT_MAX ? -mx[0] * c2 : 0.0f,
                         mx[1] > -FLT_MAX ? -mx[1] * c2 : 0.0f};
  float sum[2] = {0.0f, 0.0f};
  uint32_t pa[kWarpTiles][4];
#pragma unroll
  for (int t = 0; t < kWarpTiles; ++t) {
#pragma unroll
    for (int e = 0; e < Layout::kPerTile; ++e) {
      const int r = Layout::slot(e);
      s[t][e] = fast_exp2(fmaf(s[t][e], c2, bias[r]));
      sum[r] += s[t][e];
    }
    Layout::to_a(pa[t], s[t]);
  }
  if constexpr (kNarrow && kScores) {
    if (out.sums) write_quartets(m, out, key0, s);
  }
  sum[0] = Layout::head_sum(sum[0]), sum[1] = Layout::head_sum(sum[1]);
  if (Layout::writes_stats(gid, tq)) {  // the maxes in log2 units, as the fold takes them
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int h = Layout::head(gid, tq, r);
      if (h < m.hpg) warp_ml[warp][h] = make_float2(mx[r] * c2, sum[r]);
    }
    if (kNarrow && kScores && out.sums) write_warp_max(m, out, key0, tq, mx);
  }
  warp_values<kDv>(tl, dv, m.hpg, key0, tiles, pa);
  stamp(2);
  __syncthreads();  // every warp's partial and (max, sum) are in
  // The warps' partials folded in warp order, four outputs a thread, without a branch: a warp
  // without keys has max −FLT_MAX·c2, whose weight 2^(max − top) is 0, and a partial of zeros.
  // The thread of a head's first four outputs also writes its (max, sum), the max in natural
  // units again.
  const int quads = dv / 4;
  for (int i = threadIdx.x; i < m.hpg * quads; i += blockDim.x) {
    const int h = i / quads, e = 4 * (i - h * quads);
    float2 x[kTileWarps];
    float4 y[kTileWarps];
#pragma unroll
    for (int w = 0; w < kTileWarps; ++w) {
      x[w] = warp_ml[w][h];
      y[w] = *reinterpret_cast<const float4*>(partial_at(tl, w * kWarpKeys, h, e));
    }
    float top = x[0].x;
#pragma unroll
    for (int w = 1; w < kTileWarps; ++w) top = fmaxf(top, x[w].x);
    float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    float total = 0.0f;
#pragma unroll
    for (int w = 0; w < kTileWarps; ++w) {
      const float f = fast_exp2(x[w].x - top);
      acc.x = fmaf(f, y[w].x, acc.x), acc.y = fmaf(f, y[w].y, acc.y);
      acc.z = fmaf(f, y[w].z, acc.z), acc.w = fmaf(f, y[w].w, acc.w);
      total = fmaf(f, x[w].y, total);
    }
    *reinterpret_cast<float2*>(o + h * dv + e) = make_float2(acc.x, acc.y);
    *reinterpret_cast<float2*>(o + h * dv + e + 2) = make_float2(acc.z, acc.w);
    if (e == 0) *reinterpret_cast<float2*>(ml + 2 * h) = make_float2(top * kLn2, total);
  }
}

// tile_attend for the decoder's head dims: d_k = d_v = 64 (m7c_125m) compiled for them, every
// other shape with its dims read at run time (correct, not tuned).
// kScores: the part may leave scores or block sums (`out`); without, that code is not compiled in
// (the picks' parts).
template <bool kScores, typename Stamps = NoStamps>
__device__ __forceinline__ void tile_attend_part(const DecodeDims& m, const Tile& tl, int count,
                                                 const ScoresOut& out, float* ml, float* o,
                                                 Stamps stamp = {}) {
  if (narrow_scores(m.dk, m.dv, m.hpg)) {
    tile_attend<64, 64, true, kScores>(m, tl, count, out, ml, o, stamp);
  } else if (m.dk == 64 && m.dv == 64) {
    tile_attend<64, 64, false, kScores>(m, tl, count, out, ml, o, stamp);
  } else {
    tile_attend<0, 0, false, kScores>(m, tl, count, out, ml, o, stamp);
  }
}

// An empty part: max −FLT_MAX, sum 0 for every head (the merges skip it; its o is not read).
__device__ __forceinline__ void write_empty(const DecodeDims& m, float* ml) {
  for (int h = threadIdx.x; h < m.hpg; h += blockDim.x)
    *reinterpret_cast<float2*>(ml + 2 * h) = make_float2(-FLT_MAX, 0.0f);
}

}  // namespace nsa::cuda::decode
