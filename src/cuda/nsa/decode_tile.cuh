// One part of decode attention (decode_params.cuh): the group's hpg ≤ 16 heads against up to
// kPartKeys keys staged in shared memory, on the tensor cores – the heads are the 16 rows of
// m16n8k16 tiles (rows ≥ hpg are zeros and ignored), S = Q·Kᵀ with the keys split over the warps,
// the part's softmax per head in fp32, then O = P·V with the value columns split over the warps
// (P in bf16, as the training forward). A part issues every load it needs (q, key and value rows,
// cp.async) before it waits for any: one memory round trip.
#pragma once

#include <cfloat>

#include "common/mma.cuh"
#include "decode_params.cuh"

namespace nsa::cuda::decode {

__host__ __device__ constexpr int round16(int x) {
  return (x + 15) / 16 * 16;
}

// The staged tile: q [16, dk], keys [kPartKeys, dk], values [kPartKeys, dv] and probabilities
// [16, kPartKeys] (bf16). q, the values and the probabilities have padded rows (mma.cuh's
// tile_stride) so that the fragment loads are free of bank conflicts; the keys are packed and
// swizzled instead (key_piece), which saves the 2 KiB of padding that decides the occupancy: 36.3
// KiB at dk = dv = 64, six part CTAs per SM (five with padded keys). The probabilities take the
// keys' space (the keys are dead once S = Q·Kᵀ is in registers, where the softmax runs).
struct Tile {
  bf16 *q, *k, *v, *p;
  int qs, vs, ps;  // row strides in elements
  int nk;          // 16-byte pieces of a key row (dk / 8)
};

// Where piece j (8 bf16) of key row c lies among the packed keys' pieces, nk = dk / 8 to a row: the
// piece's index i = c·nk + j with its low three bits XOR-ed by the key row's (nk a multiple of 8)
// or else by its 128-byte line's (i / 8) – a permutation within each line, under which the eight
// rows of a fragment load (the same j) fall on eight different 16-byte bank groups when nk is a
// power of two (dk = 16, 32, 64, 128, 256). No division: this runs for every piece.
__host__ __device__ __forceinline__ constexpr int key_piece(int c, int j, int nk) {
  const int i = c * nk + j;
  return i ^ (((nk & 7) == 0 ? c : i >> 3) & 7);
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
  return tl.k + 8 * key_piece(c, j, tl.nk);
}

// Bytes of the keys' space: the keys, or the probabilities if they take more.
__host__ __device__ constexpr size_t tile_key_bytes(int dk) {
  const size_t keys = sizeof(bf16) * static_cast<size_t>(kPartKeys) * dk;
  const size_t p = sizeof(bf16) * static_cast<size_t>(kMaxHeadsPerGroup) * tile_stride(kPartKeys);
  return keys > p ? keys : p;
}

__host__ __device__ constexpr size_t tile_bytes(int dk, int dv) {
  return sizeof(bf16) * static_cast<size_t>(kMaxHeadsPerGroup) * tile_stride(dk) +
         tile_key_bytes(dk) + sizeof(bf16) * static_cast<size_t>(kPartKeys) * tile_stride(dv);
}

// Carves the tile out of dynamic shared memory at `base` (16-byte aligned; every piece is a
// multiple of 16 bytes).
__device__ __forceinline__ Tile carve_tile(unsigned char* base, int dk, int dv) {
  Tile t;
  t.qs = tile_stride(dk), t.vs = tile_stride(dv), t.nk = dk / 8;
  t.ps = tile_stride(kPartKeys);
  t.q = reinterpret_cast<bf16*>(base);
  unsigned char* keys = base + sizeof(bf16) * kMaxHeadsPerGroup * t.qs;
  t.k = reinterpret_cast<bf16*>(keys);
  t.p = reinterpret_cast<bf16*>(keys);  // the probabilities over the dead keys
  t.v = reinterpret_cast<bf16*>(keys + tile_key_bytes(dk));
  return t;
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
      cp_async16(dst, src + r * m.dk + 8 * c8);
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
      cp_async16(key_at(tl, c, j), k_first + c * k_stride + 8 * j);
    } else {
      cp_async16(tl.v + c * tl.vs + 8 * (j - nk), v_first + c * v_stride + 8 * (j - nk));
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
      cp_async16(key_at(tl, c, j), rows.k[c] + 8 * j);
    } else {
      cp_async16(tl.v + c * tl.vs + 8 * (j - nk), rows.v[c] + 8 * (j - nk));
    }
  });
  tile_fix_rows(m, tl, count, -1, make_uint4(0, 0, 0, 0));
}

// The part's softmax where S lies, in registers: this thread holds rows gid (e & 2 == 0) and
// gid + 8 at columns n0 + 2·tq + (e & 1) + 8·(e ≥ 4). Each row's max and sum of exp over the
// warp's keys meet in its quad (two shuffles), then over the warps in shared memory (two
// barriers) – instead of staging S there and a warp per head folding its keys over 32 lanes
// (docs/perf.md, seventeenth session: the NSA attention 3–7 % faster; P is stored in pairs –
// single bf16 stores cost our dense decoding 7–9 % in a candidate). The max is exact, so P
// is the same bf16 as the staged form's; only the fp32 sum's order differs.
template <int kTilesPerWarp>
__device__ __forceinline__ void softmax_registers(const DecodeDims& m, const Tile& tl, int count,
                                                  float* s_out, int64_t s_stride, float* ml,
                                                  float (&acc)[kTilesPerWarp][8]) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int gid = lane / 4, tq = lane % 4, kc = round16(count);
  constexpr int kWarps = kPartThreads / 32;
  __shared__ float warp_max[kWarps][kMaxHeadsPerGroup], warp_sum[kWarps][kMaxHeadsPerGroup];
  const auto col_of = [&](int i, int e) {
    return 16 * (warp + i * kWarps) + 2 * tq + (e & 1) + (e >= 4 ? 8 : 0);
  };
  float mx[2] = {-FLT_MAX, -FLT_MAX};
#pragma unroll
  for (int i = 0; i < kTilesPerWarp; ++i) {
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      acc[i][e] = col_of(i, e) < count ? acc[i][e] * m.scale : -FLT_MAX;  // scaled, masked
      mx[(e >> 1) & 1] = fmaxf(mx[(e >> 1) & 1], acc[i][e]);
    }
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
    mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
    if (tq == 0) warp_max[warp][gid + 8 * r] = mx[r];
  }
  __syncthreads();  // the keys are read (P takes their space) and every warp's maxes are in
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    mx[r] = warp_max[0][gid + 8 * r];
#pragma unroll
    for (int w = 1; w < kWarps; ++w) mx[r] = fmaxf(mx[r], warp_max[w][gid + 8 * r]);
  }
  float sum[2] = {0.0f, 0.0f};
#pragma unroll
  for (int i = 0; i < kTilesPerWarp; ++i) {
#pragma unroll
    for (int e = 0; e < 8; e += 2) {  // columns c, c + 1 of one row: one 4-byte store
      const int r = (e >> 1) & 1, h = gid + 8 * r, c = col_of(i, e);
      // Rows ≥ hpg (no head) are left as they are: an MMA row only feeds its own output row,
      // which is not written. Keys count .. kc − 1 get p = 0 (the MMAs read them).
      if (c >= kc || h >= m.hpg) continue;
      const float p0 = c < count ? __expf(acc[i][e] - mx[r]) : 0.0f;
      const float p1 = c + 1 < count ? __expf(acc[i][e + 1] - mx[r]) : 0.0f;
      *reinterpret_cast<__nv_bfloat162*>(tl.p + h * tl.ps + c) = __floats2bfloat162_rn(p0, p1);
      sum[r] += p0;
      sum[r] += p1;
      if (s_out && c < count) s_out[h * s_stride + c] = acc[i][e];
      if (s_out && c + 1 < count) s_out[h * s_stride + c + 1] = acc[i][e + 1];
    }
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    sum[r] += __shfl_xor_sync(0xffffffffu, sum[r], 1);
    sum[r] += __shfl_xor_sync(0xffffffffu, sum[r], 2);
    if (tq == 0) warp_sum[warp][gid + 8 * r] = sum[r];
  }
  __syncthreads();            // P and every warp's sums are in
  if (threadIdx.x < m.hpg) {  // the warps' sums in warp order
    const int h = threadIdx.x;
    float total = warp_sum[0][h], top = warp_max[0][h];
#pragma unroll
    for (int w = 1; w < kWarps; ++w) total += warp_sum[w][h], top = fmaxf(top, warp_max[w][h]);
    *reinterpret_cast<float2*>(ml + 2 * h) = make_float2(top, total);
  }
}

// mma.cuh's load_b_rows_x2 on the swizzled keys: B fragments of the key tiles n0 and n0 + 8 at the
// 16 columns from k0 (lanes 8m .. 8m + 7 give the rows of matrix m: keys n0 + 8·(m / 2) + r, piece
// k0 / 8 + m mod 2).
__device__ __forceinline__ void load_key_fragments(uint32_t b[4], const Tile& tl, int n0, int k0) {
  const int lane = threadIdx.x & 31, m = lane >> 3, r = lane & 7;
  ldmatrix_x4(b, key_at(tl, n0 + (m >> 1) * 8 + r, (k0 >> 3) + (m & 1)));
}

// The attention of the staged part (its loads landed and a barrier passed): per head h < hpg the
// part's max and sum of exp (ml[2h], ml[2h + 1], fp32) and its unnormalised output o[h·dv + e],
// written to global memory; with s_out, also the scaled scores s_out[h·s_stride + c]. count ≥ 1.
// Every thread of the CTA calls it.
__device__ void tile_attend(const DecodeDims& m, const Tile& tl, int count, float* s_out,
                            int64_t s_stride, float* ml, float* o) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, nw = blockDim.x / 32;
  const int gid = lane / 4, tq = lane % 4, kc = round16(count);
  // S = Q·Kᵀ, the 16-key tiles n0 = 16·warp, + 16·kWarps, … in registers.
  constexpr int kWarps = kPartThreads / 32, kTilesPerWarp = kPartKeys / (16 * kWarps);
  float acc[kTilesPerWarp][8];
#pragma unroll
  for (int i = 0; i < kTilesPerWarp; ++i) {
    const int n0 = 16 * (warp + i * kWarps);
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[i][e] = 0.0f;
    if (n0 >= kc) continue;
    for (int k0 = 0; k0 < m.dk; k0 += 16) {
      uint32_t a[4], bb[4];
      load_a(a, tl.q, tl.qs, 0, k0);
      load_key_fragments(bb, tl, n0, k0);
      mma_16816(acc[i], a, bb);
      mma_16816(acc[i] + 4, a, bb + 2);
    }
  }
  softmax_registers(m, tl, count, s_out, s_stride, ml, acc);
  // O = P·V, one 16-column tile per warp at a time; rows < hpg go out.
  for (int n0 = 16 * warp; n0 < m.dv; n0 += 16 * nw) {
    float c0[4] = {0, 0, 0, 0}, c1[4] = {0, 0, 0, 0};
    for (int k0 = 0; k0 < kc; k0 += 16) {
      uint32_t a[4], bb[4];
      load_a(a, tl.p, tl.ps, 0, k0);
      load_b_cols_x2(bb, tl.v, tl.vs, k0, n0);
      mma_16816(c0, a, bb);
      mma_16816(c1, a, bb + 2);
    }
    const int col = n0 + 2 * tq;
    if (gid < m.hpg) {
      *reinterpret_cast<float2*>(o + gid * m.dv + col) = make_float2(c0[0], c0[1]);
      *reinterpret_cast<float2*>(o + gid * m.dv + col + 8) = make_float2(c1[0], c1[1]);
    }
    if (gid + 8 < m.hpg) {
      *reinterpret_cast<float2*>(o + (gid + 8) * m.dv + col) = make_float2(c0[2], c0[3]);
      *reinterpret_cast<float2*>(o + (gid + 8) * m.dv + col + 8) = make_float2(c1[2], c1[3]);
    }
  }
}

// An empty part: max −FLT_MAX, sum 0 for every head (the merges skip it; its o is not read).
__device__ __forceinline__ void write_empty(const DecodeDims& m, float* ml) {
  for (int h = threadIdx.x; h < m.hpg; h += blockDim.x)
    *reinterpret_cast<float2*>(ml + 2 * h) = make_float2(-FLT_MAX, 0.0f);
}

}  // namespace nsa::cuda::decode
