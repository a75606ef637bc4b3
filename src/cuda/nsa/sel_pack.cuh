// Query packing for the selected branch's row-centric kernels (forward and dq).
//
// A warp serves R consecutive query rows of one sequence and one group: the 16 rows of its MMAs
// are (row r, head h) → r·hslot + h with hslot = min(hpg, 16), so a group with few heads (6 in
// m7c_125m) still fills the tensor cores, and every K/V chunk staged in shared memory serves all R
// rows. The warp walks the ascending union of the R rows' selected blocks; each union entry keeps
// a bit mask of the rows that chose it, and row r sees a key only if its mask bit is set and the
// key is at or before its own position. A row's keys are visited in the same ascending order as
// with one row per warp, and masked entries contribute exact zeros, so results do not depend on
// the packing. Groups with 16 or more heads get R = 1 and loop over 16-head slices.
#pragma once

#include <climits>

#include "tiles.cuh"

namespace nsa::cuda {

// Rows per warp: as many as fit in 16 MMA rows, while the union list (R·n_sel entries at most)
// stays within 256 entries.
__host__ __device__ inline int sel_rows_per_warp(int64_t hpg, int64_t n_sel) {
  if (hpg >= 16) return 1;
  int r = static_cast<int>(16 / hpg);
  while (r > 1 && r * n_sel > 256) --r;
  return r;
}

// Shared memory per warp for its union list: blocks (int32) and row masks (uint32).
__host__ __device__ inline size_t sel_union_bytes(int64_t hpg, int64_t n_sel) {
  return static_cast<size_t>(sel_rows_per_warp(hpg, n_sel) * n_sel) * 2 * sizeof(int32_t);
}

// One pass of a warp: rows [row0, row0 + R) of sequence n (positions t0 ...), group g.
struct SelPack {
  int64_t row0, t0, g, seq;
  int R, hslot, n_union;
  const int32_t* blocks;  // the union, ascending (shared memory)
  const uint32_t* masks;  // bit r: row r chose the block

  // The MMA row m's query row offset r (or -1 when unused) for the head slice starting at h0.
  __device__ int row_of(const NsaParams& p, int m, int64_t h0) const {
    const int r = m / hslot;
    return r < R && h0 + m % hslot < p.hpg ? r : -1;
  }
  // Flat (row, head) index into [T, H] arrays of MMA row m, or -1.
  __device__ int64_t th(const NsaParams& p, int m, int64_t h0) const {
    const int r = row_of(p, m, h0);
    return r < 0 ? -1 : (row0 + r) * p.H + g * p.hpg + h0 + m % hslot;
  }
  __device__ SelectedChunks chunks(const NsaParams& p) const {
    return SelectedChunks{blocks, p.l_sel, t0 + R - 1,
                          (p.l_sel + kSelChunkRows - 1) / kSelChunkRows};
  }
  __device__ int64_t n_chunks(const NsaParams& p) const {
    return n_union * ((p.l_sel + kSelChunkRows - 1) / kSelChunkRows);
  }
};

// Builds the union of the rows' selected blocks into the warp's shared lists (lane r walks row r's
// ascending list; each step takes the warp-wide minimum).
__device__ inline SelPack make_sel_pack(const NsaParams& p, int64_t row0, int64_t t0, int R,
                                        int64_t g, int32_t* blocks, uint32_t* masks) {
  const int lane = threadIdx.x & 31;
  const int32_t* list = p.sel_idx + ((row0 + (lane < R ? lane : 0)) * p.G + g) * p.n_sel;
  int idx = 0, n = 0;
  while (true) {
    int v = INT_MAX;
    if (lane < R && idx < p.n_sel && list[idx] >= 0) v = list[idx];
    int mn = v;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) mn = min(mn, __shfl_xor_sync(0xffffffffu, mn, o));
    if (mn == INT_MAX) break;
    const uint32_t bits = __ballot_sync(0xffffffffu, v == mn);
    if (v == mn) ++idx;
    if (lane == 0) blocks[n] = mn, masks[n] = bits;
    ++n;
  }
  __syncwarp();
  const int hslot = p.hpg < 16 ? static_cast<int>(p.hpg) : 16;
  return SelPack{row0, t0, g, -1, R, hslot, n, blocks, masks};
}

// The passes of this warp's rows – warp w of CTA x owns rows [(warps·x + w)·R, +R) of group
// blockIdx.y, one pass per sequence they touch:  for (SelPack pack; passes.next(pack);) { ... }.
// union_smem: the CTA's union lists, sel_union_bytes(hpg, n_sel) per warp.
struct SelPasses {
  int64_t row, end, g;
  int32_t* blocks;
  uint32_t* masks;

  __device__ SelPasses(const NsaParams& p, int R, int warps, unsigned char* union_smem) {
    const int warp = threadIdx.x >> 5;
    row = (static_cast<int64_t>(blockIdx.x) * warps + warp) * R;
    end = row + R < p.T ? row + R : p.T;
    g = blockIdx.y;
    blocks = reinterpret_cast<int32_t*>(union_smem) + warp * 2 * R * p.n_sel;
    masks = reinterpret_cast<uint32_t*>(blocks + R * p.n_sel);
  }
  __device__ bool next(const NsaParams& p, SelPack& pack) {
    if (row >= end) return false;
    const int64_t n = p.seq_of_row[row], seq_end = p.cu_seqlens[n + 1];
    const int rows = static_cast<int>((end < seq_end ? end : seq_end) - row);
    pack = make_sel_pack(p, row, row - p.cu_seqlens[n], rows, g, blocks, masks);
    pack.seq = n;
    row += rows;
    return true;
  }
};

// The warp's K/V pipeline over the pack's union (its own slice of the CTA's shared memory).
template <int DK, int DV>
__device__ __forceinline__ KvPipeline<DK, DV, kSelChunkRows, true, SelectedChunks> sel_pipeline(
    const NsaParams& p, const SelPack& pack, unsigned char* smem) {
  using Pipe = KvPipeline<DK, DV, kSelChunkRows, true, SelectedChunks>;
  return make_pipeline<DK, DV, kSelChunkRows, true>(
      smem + (threadIdx.x >> 5) * Pipe::kBytes, raw_rows(p, 1, pack.seq, pack.g), pack.chunks(p));
}

// A fragments of the pack's (row, head) rows of a [T, H, D] tensor (q or dO), zeros where unused.
template <int D>
__device__ __forceinline__ void load_pack_rows(uint32_t a[][4], const NsaParams& p,
                                               const SelPack& pack, int64_t h0, const bf16* base) {
  load_a_rows<D>(a, [&](int m) -> const bf16* {
    const int64_t th = pack.th(p, m, h0);
    return th >= 0 ? base + th * D : nullptr;
  });
}

// What one thread needs for its two MMA rows (gid, gid + 8) to mask a chunk's scores.
struct SelRowMask {
  int r[2];      // row offset in the pack, -1 when the MMA row is unused
  int64_t t[2];  // its position in the sequence
  __device__ SelRowMask(const NsaParams& p, const SelPack& pack, int64_t h0) {
    const int gid = (threadIdx.x & 31) >> 2;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      r[i] = pack.row_of(p, gid + 8 * i, h0);
      t[i] = pack.t0 + (r[i] < 0 ? 0 : r[i]);
    }
  }
  // Scales chunk it's scores to the log2 domain, −inf where the row does not see the key.
  template <int NT>
  __device__ void apply(float s[][4], const NsaParams& p, const SelPack& pack, int64_t it,
                        const KeyChunk& c, float sl2) const {
    const uint32_t bits = pack.masks[it / ((p.l_sel + kSelChunkRows - 1) / kSelChunkRows)];
    const bool sees[2] = {r[0] >= 0 && ((bits >> r[0]) & 1u), r[1] >= 0 && ((bits >> r[1]) & 1u)};
    const int tq = threadIdx.x & 3;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = e >> 1, j = nt * 8 + 2 * tq + (e & 1);
        const bool vis = sees[i] && j < c.nk && c.k0 + j <= t[i];
        s[nt][e] = vis ? s[nt][e] * sl2 : -INFINITY;
      }
    }
  }
};

}  // namespace nsa::cuda
