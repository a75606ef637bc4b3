// (query, head) pair tiles: how the key-centric dK/dV kernels of every branch walk the queries
// that see a unit of key rows. The queries – a row range for
// the window and compressed branches, the inverted selection index's entry list for the selected
// branch – are flattened with the group's heads into pairs (ascending rows, then heads) and staged
// QT at a time in shared memory, double-buffered with cp.async.
#pragma once

#include "tiles.cuh"
#include "wgmma_tiles.cuh"

namespace nsa::cuda {

// Pairs per tile: 32 for the widest heads keeps the kernels' accumulators in registers.
template <int DK>
constexpr int pair_tile() {
  return DK > 128 ? 32 : 64;
}

// Which queries see unit u: positions [q_begin, q_end) of a row range (query row =
// seq_start + position) or of the selected branch's entry list.
struct UnitQueries {
  int64_t seq_start, q_begin, q_end;
  const uint64_t* list;
};

// The first entry of list[lo, hi) whose low 32 bits (row·n_sel + slot) are >= v (ascending).
__device__ __forceinline__ int64_t lower_entry(const uint64_t* list, int64_t lo, int64_t hi,
                                               uint64_t v) {
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if ((list[mid] & 0xffffffffu) < v) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return lo;
}

// The queries of unit u; the selected branch's keep only entries of query rows [r0, r1).
template <Branch B>
__device__ UnitQueries unit_queries(const NsaParams& p, const RowTile& unit, int64_t g,
                                    int64_t r0 = 0, int64_t r1 = -1) {
  UnitQueries u;
  const int64_t n = unit.seq;
  u.seq_start = p.cu_seqlens[n];
  const int64_t len = p.cu_seqlens[n + 1] - u.seq_start;
  u.list = nullptr;
  if constexpr (B == Branch::kWin) {
    u.q_begin = unit.first;
    const int64_t last = unit.first + unit.rows - 1 + p.w - 1;
    u.q_end = last + 1 < len ? last + 1 : len;
  } else if constexpr (B == Branch::kCmp) {
    u.q_begin = unit.first * p.d + p.l - 1;
    u.q_end = len;
  } else {
    const int64_t seg = g * p.TB + p.blk_offsets[n] + unit.first / p.l_sel;
    u.q_begin = p.sel_seg_start[seg];
    u.q_end = p.sel_seg_end[seg];
    u.list = p.sel_entries;
    if (r1 >= 0 && u.q_end > u.q_begin) {
      const int64_t b = lower_entry(u.list, u.q_begin, u.q_end, r0 * p.n_sel);
      u.q_end = lower_entry(u.list, b, u.q_end, r1 * p.n_sel);
      u.q_begin = b;
    }
  }
  if (u.q_end < u.q_begin) u.q_end = u.q_begin;
  return u;
}

// The pairs of chunk z (of `chunks`) of a unit's queries.
struct PairList {
  UnitQueries u;
  int64_t qa;         // first query position of the chunk
  int n, hpg, n_sel;  // pairs, heads per group, selected blocks per query
  // Pair i's entry: row·n_sel + slot for the selected branch's list, else the query row (global);
  // rows ascend with i.
  __device__ int64_t entry(int i) const {
    const int64_t qi = qa + i / hpg;
    return u.list ? static_cast<int64_t>(u.list[qi] & 0xffffffffu) : u.seq_start + qi;
  }
};

__device__ __forceinline__ PairList chunk_pairs(const UnitQueries& u, int64_t z, int64_t chunks,
                                                int hpg, int n_sel) {
  const int64_t total = u.q_end - u.q_begin;
  const int64_t qa = u.q_begin + total * z / chunks, qb = u.q_begin + total * (z + 1) / chunks;
  return {u, qa, static_cast<int>((qb - qa) * hpg), hpg, n_sel};
}

// One stage: Q rows and (kGrad) dO rows with the indices and branch statistics of QT pairs. The
// statistics arrive by 4-byte cp.async together with the rows (the gate as the aligned bf16 pair
// that holds it); finish_stats turns them into what the kernels read once the stage has landed.
// kSw: the rows as 128-byte-swizzled tiles for warpgroup MMA (wgmma_tiles.cuh; 64 pairs, the
// stage a multiple of 1024 bytes so that both stages of a 1024-aligned buffer stay aligned),
// else padded tiles (tile_stride) for ldmatrix.
template <int DK, int DV, bool kGrad, bool kSw = false>
struct PairStage {
  static constexpr int QT = kSw ? 64 : pair_tile<DK>();
  static constexpr bool kSwizzled = kSw;
  static constexpr size_t kQBytes = QT * (kSw ? DK : tile_stride(DK)) * sizeof(bf16);
  static constexpr size_t kDoBytes = kGrad ? QT * (kSw ? DV : tile_stride(DV)) * sizeof(bf16) : 0;
  static constexpr size_t kUsed =
      kQBytes + kDoBytes + QT * sizeof(int64_t) + QT * 5 * sizeof(float);
  static constexpr size_t kBytes = kSw ? (kUsed + 1023) / 1024 * 1024 : kUsed;
  static_assert((kQBytes + kDoBytes + QT * sizeof(int64_t)) % 8 == 0,
                "the statistics are read as float2 pairs");
  bf16* q;
  bf16* d_o;                   // kGrad only
  int64_t* th;                 // query row·H + head, −1 for padding pairs
  float *lse2, *delta, *gate;  // kGrad only: log2-domain lse, delta, gate (after finish_stats)
  int32_t* t;                  // query position in the sequence, −1 for padding pairs
  int32_t* slot;               // selected branch: which of the query's n_sel choices the block is
  __device__ explicit PairStage(unsigned char* base)
      : q(reinterpret_cast<bf16*>(base)),
        d_o(reinterpret_cast<bf16*>(base + kQBytes)),
        th(reinterpret_cast<int64_t*>(base + kQBytes + kDoBytes)),
        lse2(reinterpret_cast<float*>(th + QT)),
        delta(lse2 + QT),
        gate(delta + QT),
        t(reinterpret_cast<int32_t*>(gate + QT)),
        slot(t + QT) {}

  // After this thread's cp.async wait for the stage, before the barrier that publishes it: each
  // thread converts the statistics it copied (fill_pair_stage's thread-to-pair mapping).
  __device__ void finish_stats() const {
    if constexpr (kGrad) {
      for (int i = threadIdx.x; i < QT; i += blockDim.x) {
        if (th[i] < 0) continue;
        lse2[i] *= kLog2e;
        const uint32_t w = __float_as_uint(gate[i]);
        gate[i] = __bfloat162float(
            __ushort_as_bfloat16(static_cast<unsigned short>((th[i] & 1) ? w >> 16 : w & 0xffffu)));
      }
    }
  }
};

// Thread i's list entry (row·n_sel + slot) for pair pb + i of a stage, for the selected branch
// (0 past the pairs and for the other branches, whose entries are arithmetic). The list is in
// device memory: a CTA loads a stage's entries one stage ahead, or the barrier of fill_pair_stage
// would wait for the load on every tile.
template <int QT>
__device__ __forceinline__ uint32_t list_entry_ahead(const PairList& pairs, int pb) {
  const int k = pb + static_cast<int>(threadIdx.x);
  return pairs.u.list && static_cast<int>(threadIdx.x) < QT && k < pairs.n
             ? static_cast<uint32_t>(pairs.entry(k))
             : 0u;
}

// Fills stage st with pairs pb..pb+QT−1 of branch c (a CTA of kN >= QT threads): indices first
// (thread i takes pair pb + i, whose list entry it loaded with list_entry_ahead, and starts the
// copies of its statistics), a barrier, then the rows by cp.async (committed with the statistics;
// the caller waits, then calls finish_stats). All threads call it.
template <int c, int kN, int DK, int DV, bool kGrad, bool kSw>
__device__ void fill_pair_stage(const NsaParams& p, const PairList& pairs, int64_t g, int pb,
                                uint32_t list_entry, const PairStage<DK, DV, kGrad, kSw>& st) {
  constexpr int QT = PairStage<DK, DV, kGrad, kSw>::QT;
  static_assert(kN >= QT, "one index thread per pair");
  if (const int i = static_cast<int>(threadIdx.x); i < QT) {
    const int k = pb + i;
    int64_t th = -1;
    int32_t t = -1, slot = 0;
    if (k < pairs.n) {
      // 32-bit divisions (a list entry row·n_sel + slot fits in 32 bits): with 64-bit ones the
      // index threads kept the others waiting at the barrier below.
      const int64_t entry = pairs.u.list ? static_cast<int64_t>(list_entry) : pairs.entry(k);
      int64_t row = entry;
      if (pairs.u.list) {
        const uint32_t e32 = static_cast<uint32_t>(entry), n_sel = pairs.n_sel;
        const uint32_t r32 = e32 / n_sel;
        row = r32;
        slot = static_cast<int32_t>(e32 - r32 * n_sel);
      }
      th = row * p.H + g * pairs.hpg + k % pairs.hpg;
      t = static_cast<int32_t>(row - pairs.u.seq_start);
    }
    st.th[i] = th;
    st.t[i] = t;
    st.slot[i] = slot;
    if constexpr (kGrad) {
      if (th >= 0) {
        cp_async<4>(st.lse2 + i, p.lse[c] + th);
        cp_async<4>(st.delta + i, p.delta[c] + th);
        cp_async<4>(st.gate + i, p.gate[c] + (th & ~int64_t{1}));
      } else {
        st.lse2[i] = st.delta[i] = st.gate[i] = 0.0f;
      }
    }
  }
  __syncthreads();
  const auto q_row = [&](int i) -> const bf16* {
    return st.th[i] < 0 ? nullptr : p.q + st.th[i] * DK;
  };
  const auto do_row = [&](int i) -> const bf16* {
    return st.th[i] < 0 ? nullptr : p.d_o + st.th[i] * DV;
  };
  if constexpr (kSw) {
    load_sw_tile<DK, QT, kN>(reinterpret_cast<unsigned char*>(st.q), q_row, threadIdx.x);
    if constexpr (kGrad) {
      load_sw_tile<DV, QT, kN>(reinterpret_cast<unsigned char*>(st.d_o), do_row, threadIdx.x);
    }
  } else {
    load_tile<DK, true>(st.q, QT, q_row, threadIdx.x, blockDim.x);
    if constexpr (kGrad) load_tile<DV, true>(st.d_o, QT, do_row, threadIdx.x, blockDim.x);
  }
  cp_async_commit();
}

// Walks a pair list in stages of Stage::QT pairs, double-buffered in `stages`: fills stage it + 1
// (its list entries loaded one stage ahead, list_entry_ahead) while stage it is in use, waits for
// stage it, publishes it (to wgmma too) and calls body(it, st). The body must end with a barrier:
// the next step refills the buffer it used. Run by all kN threads of the CTA; copies the caller
// issued before (a unit's or a block's K/V tiles) complete with stage 0.
template <int c, int kN, typename Stage, typename Body>
__device__ __forceinline__ void walk_pair_stages(const NsaParams& p, const PairList& pairs,
                                                 int64_t g, unsigned char* stages, Body&& body) {
  constexpr int QT = Stage::QT;
  uint32_t ahead = list_entry_ahead<QT>(pairs, 0);  // this thread's entry of the next fill
  const auto fill = [&](int64_t it) {
    const int pb = static_cast<int>(it) * QT;
    fill_pair_stage<c, kN>(p, pairs, g, pb, ahead, Stage(stages + (it & 1) * Stage::kBytes));
    ahead = list_entry_ahead<QT>(pairs, pb + QT);
  };
  const int n_tiles = (pairs.n + QT - 1) / QT;
  if (n_tiles > 0) fill(0);
  for (int it = 0; it < n_tiles; ++it) {
    const Stage st(stages + (it & 1) * Stage::kBytes);
    issue_next_wait_current(it, n_tiles, fill);
    if constexpr (Stage::kSwizzled) fence_proxy_async_smem();  // the tiles are read by wgmma
    st.finish_stats();
    __syncthreads();
    body(it, st);
  }
}

}  // namespace nsa::cuda
