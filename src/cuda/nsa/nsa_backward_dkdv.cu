// NSA backward on tensor cores (v2), part 2: dK/dV of each branch, key-centric and deterministic.
//
// A CTA owns a unit of at most 64 key rows of one group (raw rows for the window, compressed
// tokens for the compressed branch, rows of one selection block for the selected branch); warp w
// owns unit rows 16w..16w+15. The queries that can see the unit – a row range for window and
// compressed, the inverted index's entry list for the selected branch – are flattened with the
// group's heads into (query, head) pairs and walked in tiles of QT pairs staged in shared memory:
//   Sᵀ = K·Qᵀ, dPᵀ = V·dOᵀ (tensor cores), Pᵀ = exp(Sᵀ − lse), dSᵀ = Pᵀ ∘ (g·dPᵀ − delta),
//   dV += (g·Pᵀ)·dO, dK += scale·dSᵀ·Q, with the accumulators in registers.
// No atomics: pairs are visited in ascending order. Long query lists are split into `chunks` CTAs
// that write partial sums; a second kernel adds the partials in chunk order. For head dims that are
// multiples of 64 the four products (and the fused dq) run on warpgroup MMA, the unit's K/V and
// the pair stages swizzled tiles (wgmma_tiles.cuh): up to 128 the CTA's four warps are one
// warpgroup; at dk = 192 two warpgroups split the products (unit_dkdv_split), as one could not
// hold both accumulators. Other dims run on mma.sync with padded tiles.
//
// The selected branch's dq rides along (v3, kDq): each tile's dSᵀ is also staged in shared memory
// (bf16) and dq_pair = dS · K_unit is written per (query, head, slot, unit of the block) for the
// merge in sel_block_major.cu, so S and dP are computed once for dK, dV and dq. The partials are
// bounded by processing query rows in passes (run_sel_block_major_backward).
#include <cub/device/device_scan.cuh>

#include <algorithm>
#include <type_traits>

#include "common/cuda_check.h"
#include "head_dims.h"
#include "nsa_backward_dkdv.h"
#include "nsa_kernels.h"
#include "pair_tiles.cuh"
#include "tiles.cuh"
#include "wgmma_tiles.cuh"

namespace nsa::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
static_assert(kDkdvUnitRows == 16 * kWarps, "one warp per 16 key rows");

// dS tile of the fused selected-branch dq: QT pairs × 64 unit rows.
template <int DK, bool kDq>
__host__ __device__ constexpr size_t ds_tile_bytes() {
  return kDq ? PairStage<DK, DK, true>::QT * tile_stride(kDkdvUnitRows) * sizeof(bf16) : 0;
}

// dK/dV (and the selected branch's fused dq) on warpgroup MMA (wgmma_tiles.cuh) for head dims
// that are multiples of 64; other dims on mma.sync. Up to 128 one warpgroup holds both
// accumulators; at dk = 192 they would not fit its registers (160 a thread with a 64-pair tile),
// so two warpgroups split the products (unit_dkdv_split).
template <int DK, int DV, Branch B>
__host__ __device__ constexpr bool dkdv_wgmma() {
  return wgmma_dims(DK, DV);
}
template <int DK, int DV>
__host__ __device__ constexpr bool dkdv_split() {
  return wgmma_dims(DK, DV) && DK > 128;
}
template <int DK, int DV>
__host__ __device__ constexpr int dkdv_threads() {
  return dkdv_split<DK, DV>() ? 2 * kThreads : kThreads;
}

template <int DK, int DV, bool kDq, bool kSw = false>
__host__ __device__ constexpr size_t dkdv_smem_bytes() {
  if constexpr (kSw) {  // the dS tile: 64 pairs × 64 unit rows, swizzled; split: P's hand-off
    return kSwAlignSlack + kDkdvUnitRows * (DK + DV) * sizeof(bf16) +
           2 * PairStage<DK, DV, true, true>::kBytes +
           (kDq ? 64 * kDkdvUnitRows * sizeof(bf16) : 0) +
           (dkdv_split<DK, DV>() ? 64 * kDkdvUnitRows * sizeof(float) : 0);
  }
  return kDkdvUnitRows * (tile_stride(DK) + tile_stride(DV)) * sizeof(bf16) +
         2 * PairStage<DK, DV, true>::kBytes + ds_tile_bytes<DK, kDq>();
}

// out row (=, or +=) x for one row half of a warp's 16 × D accumulator; with dst16 the result goes
// there in bf16 instead (rounded from the fp32 value dst would have held; dst is then only read,
// with `accumulate`).
template <int D>
__device__ void store_rows(float* dst, bf16* dst16, const float acc[][4], int r, float scale,
                           bool accumulate) {
  const int tq = threadIdx.x & 3;
#pragma unroll
  for (int nt = 0; nt < D / 8; ++nt) {
    const int c = nt * 8 + 2 * tq;
    float2 v = make_float2(scale * acc[nt][2 * r], scale * acc[nt][2 * r + 1]);
    if (accumulate) {
      const float2 old = *reinterpret_cast<const float2*>(dst + c);
      v.x += old.x, v.y += old.y;
    }
    if (dst16) {
      *reinterpret_cast<__nv_bfloat162*>(dst16 + c) = __floats2bfloat162_rn(v.x, v.y);
    } else {
      *reinterpret_cast<float2*>(dst + c) = v;
    }
  }
}

// Where a chunked CTA's dK/dV go. slots == 0: straight into the gradient (added to it with
// `accumulate`). Otherwise into partial slot z = blockIdx.z (stored; summed later in slot order).
// k16 / v16 (slots == 0, or the sum of the slots): the gradient in bf16 instead of k / v, for a
// caller that wants bf16 gradients when this is the gradient's last writer (NsaParams::d_k_bf16).
struct DkdvOut {
  float* k;
  float* v;
  int64_t rows;  // key rows of the gradient (T, or C for the compressed branch)
  int64_t slots;
  bool accumulate;
  bf16* k16 = nullptr;
  bf16* v16 = nullptr;
};

// The fused dq of one pair tile: warp w takes pair group w % PG (16 pairs) and column chunks
// w / PG, w / PG + 4 / PG, ... of dq = dS · K_unit, with dS staged in ds_s by every warp.
template <int DK, int QT>
__device__ __forceinline__ void sel_tile_dq(const NsaParams& p, const SelDqPass& dq,
                                            const bf16* ds_s, const bf16* ks, const int64_t th[2],
                                            const int32_t slot[2], int64_t ub, int64_t upb) {
  constexpr int PG = QT / 16, CW = DK < 64 ? DK : 64, NC = DK / CW;
  constexpr int SDS = tile_stride(kDkdvUnitRows);
  static_assert(4 % PG == 0 && DK % CW == 0 && CW % 16 == 0, "dq work split");
  const int warp = threadIdx.x >> 5, tq = threadIdx.x & 3;
  const int pg = warp % PG;
  uint32_t a[kDkdvUnitRows / 16][4];
#pragma unroll
  for (int kk = 0; kk < kDkdvUnitRows / 16; ++kk) load_a(a[kk], ds_s, SDS, pg * 16, kk * 16);
  for (int cc = warp / PG; cc < NC; cc += 4 / PG) {
    float acc[CW / 8][4] = {};
#pragma unroll
    for (int kk = 0; kk < kDkdvUnitRows / 16; ++kk) {
#pragma unroll
      for (int nt = 0; nt < CW / 8; nt += 2) {
        uint32_t b[4];
        load_b_cols_x2(b, ks, tile_stride(DK), kk * 16, cc * CW + nt * 8);
        mma_16816(acc[nt], a[kk], b);
        mma_16816(acc[nt + 1], a[kk], b + 2);
      }
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      if (th[r] < 0) continue;
      const int64_t idx = ((th[r] - dq.r0 * p.H) * p.n_sel + slot[r]) * upb + ub;
      bf16* dst = dq.dq_part + idx * DK + cc * CW + 2 * tq;
#pragma unroll
      for (int nt = 0; nt < CW / 8; ++nt) {
        *reinterpret_cast<uint32_t*>(dst + nt * 8) = pack_bf16(acc[nt][2 * r], acc[nt][2 * r + 1]);
      }
    }
  }
}

// The unit's K/V tiles (padded, or swizzled from a 1024-aligned base with kSw), the two pair
// stages, and (kDq) the dS tile.
// The fused dq of one 64-pair tile on warpgroup MMA: dq = dS · K_unit with dS (64 pairs × 64 unit
// rows) and the unit's K both swizzled in shared memory; warp w's accumulator rows are pairs
// 16w + gid and 16w + gid + 8. The warpgroup computes dq's 64-column blocks [NB0, NB1): all of
// them, or its share of a split CTA's.
template <int DK, int NB0 = 0, int NB1 = DK / 64>
__device__ __forceinline__ void sel_tile_dq_wgmma(const NsaParams& p, const SelDqPass& dq,
                                                  const unsigned char* ds_s,
                                                  const unsigned char* ks, const int64_t th[2],
                                                  const int32_t slot[2], int64_t ub, int64_t upb) {
  constexpr int NB = NB1 - NB0;
  const int tq = threadIdx.x & 3;
  float acc[NB * 8][4];
  const uint64_t dd = sw128_tile_desc(ds_s), dk = sw128_tile_desc(ks);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kDkdvUnitRows / 16; ++kk) {
#pragma unroll
    for (int nb = 0; nb < NB; ++nb) {
      wgmma_m64n64k16_ss<true>(&acc[nb * 8][0], desc_at(dd, 32 * kk),
                               desc_at(dk, (NB0 + nb) * kDkdvUnitRows * 128 + 16 * 128 * kk),
                               kk > 0);
    }
  }
  wgmma_commit();
  wgmma_wait<0>();
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (th[r] < 0) continue;
    const int64_t idx = ((th[r] - dq.r0 * p.H) * p.n_sel + slot[r]) * upb + ub;
    bf16* dst = dq.dq_part + idx * DK + NB0 * 64 + 2 * tq;
#pragma unroll
    for (int nt = 0; nt < NB * 8; ++nt) {
      *reinterpret_cast<uint32_t*>(dst + nt * 8) = pack_bf16(acc[nt][2 * r], acc[nt][2 * r + 1]);
    }
  }
}

template <int DK, int DV, bool kDq, bool kSw = false>
struct DkdvSmem {
  using Stage = PairStage<DK, DV, true, kSw>;
  static constexpr int kKCols = kSw ? DK : tile_stride(DK), kVCols = kSw ? DV : tile_stride(DV);
  bf16* ks;
  bf16* vs;
  unsigned char* stages;
  bf16* ds;     // kDq only
  float* hand;  // dkdv_split only: P from warpgroup 0 to 1, 64 × 64 in the accumulator layout
  __device__ explicit DkdvSmem(unsigned char* base)
      : ks(reinterpret_cast<bf16*>(kSw ? sw_align(base) : base)),
        vs(ks + kDkdvUnitRows * kKCols),
        stages(reinterpret_cast<unsigned char*>(vs + kDkdvUnitRows * kVCols)),
        ds(reinterpret_cast<bf16*>(stages + 2 * Stage::kBytes)),
        hand(reinterpret_cast<float*>(ds + (kDq ? 64 * kDkdvUnitRows : 0))) {}
};

// Loads the unit's K/V rows into sm (by cp.async, committed with the first pair stage), with the
// CTA's kN threads.
template <int DK, int DV, Branch B, int kN, bool kDq, bool kSw>
__device__ __forceinline__ void load_unit_kv(const NsaParams& p, const RowTile& unit, int64_t g,
                                             const DkdvSmem<DK, DV, kDq, kSw>& sm) {
  const KvRows kv = branch_rows<B>(p, unit.seq, g);
  const auto k_row = [&](int i) -> const bf16* {
    return i < unit.rows ? kv.k + (unit.first + i) * kv.k_stride : nullptr;
  };
  const auto v_row = [&](int i) -> const bf16* {
    return i < unit.rows ? kv.v + (unit.first + i) * kv.v_stride : nullptr;
  };
  if constexpr (kSw) {
    load_sw_tile<DK, kDkdvUnitRows, kN>(reinterpret_cast<unsigned char*>(sm.ks), k_row,
                                        threadIdx.x);
    load_sw_tile<DV, kDkdvUnitRows, kN>(reinterpret_cast<unsigned char*>(sm.vs), v_row,
                                        threadIdx.x);
  } else {
    load_tile<DK>(sm.ks, kDkdvUnitRows, k_row, threadIdx.x, kN);
    load_tile<DV>(sm.vs, kDkdvUnitRows, v_row, threadIdx.x, kN);
  }
}

// What a tile's element-wise step computes (unit_scores, a bit set): P = exp(S − lse) with the
// causal mask (kProbs; else sc holds P already), g·P into sc (kGate; else P stays), dS = P ∘
// (g·dPᵀ − delta) into dpt (kDs, and with kDq also into the ds tile for the fused dq).
constexpr int kProbs = 1, kGate = 2, kDs = 4;

// This thread's 16 × QT values (C layout; key rows jl_lo, jl_lo + 8 of the unit, pair columns) of
// the steps kSteps: one pass over the registers, the pairs' statistics read once per column pair
// (the ds stores may alias them for the compiler, which then re-read them per element). The
// per-pair visibility test only where the warp's tile is not wholly visible.
template <Branch B, int kSteps, bool kDq, bool kSw, int QT, typename Stage>
__device__ __forceinline__ void unit_scores(const NsaParams& p, const RowTile& unit,
                                            const Stage& st, int it, int n_pairs, int warp,
                                            float sc[][4], float dpt[][4], bf16* ds) {
  const int jl_lo = warp * 16 + ((threadIdx.x & 31) >> 2), tq = threadIdx.x & 3;
  const int j0 = static_cast<int>(unit.first) + warp * 16;  // the warp's first key
  const MaskParams m = mask_params(p);
  const float sl2 = p.scale * kLog2e;
  const int last = it * QT + QT <= n_pairs ? QT - 1 : -1;
  const bool all = !(kSteps & kProbs) || (warp * 16 + 16 <= unit.rows && last >= 0 &&
                                          all_visible<B>(m, st.t[0], st.t[last], j0, j0 + 15));
  const auto steps = [&](auto whole_tile) {
#pragma unroll
    for (int nt = 0; nt < QT / 8; ++nt) {
      const int c0 = nt * 8 + 2 * tq;
      [[maybe_unused]] float2 lse2{}, delta{};  // read only by the steps that use them
      if constexpr ((kSteps & kProbs) != 0) lse2 = *reinterpret_cast<const float2*>(st.lse2 + c0);
      const float2 gate = *reinterpret_cast<const float2*>(st.gate + c0);
      if constexpr ((kSteps & kDs) != 0) delta = *reinterpret_cast<const float2*>(st.delta + c0);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        [[maybe_unused]] const int jl = jl_lo + (e >> 1) * 8, col = c0 + (e & 1);
        const float c_gate = e & 1 ? gate.y : gate.x;
        float pr = sc[nt][e];
        if constexpr ((kSteps & kProbs) != 0) {
          pr = fast_exp2(fmaf(pr, sl2, -(e & 1 ? lse2.y : lse2.x)));
          if constexpr (!decltype(whole_tile)::value) {
            const int t = st.t[col];
            const bool vis =
                jl < unit.rows && t >= 0 && key_visible<B>(m, t, static_cast<int>(unit.first) + jl);
            pr = vis ? pr : 0.0f;
          }
        }
        sc[nt][e] = (kSteps & kGate) != 0 ? pr * c_gate : pr;
        if constexpr ((kSteps & kDs) != 0) {
          dpt[nt][e] = pr * (c_gate * dpt[nt][e] - (e & 1 ? delta.y : delta.x));
          if constexpr (kDq && kSw) {
            *reinterpret_cast<bf16*>(reinterpret_cast<unsigned char*>(ds) + sw128_offset(col, jl)) =
                __float2bfloat16(dpt[nt][e]);
          } else if constexpr (kDq) {
            ds[col * tile_stride(kDkdvUnitRows) + jl] = __float2bfloat16(dpt[nt][e]);
          }
        }
      }
    }
  };
  if (all) {
    steps(std::true_type{});
  } else {
    steps(std::false_type{});
  }
}

// The (query·H + head, slot) of this thread's two dq rows in a pair tile (kDq): pairs 16·pg + gid
// and 16·pg + gid + 8.
template <typename Stage>
__device__ __forceinline__ void dq_rows(const Stage& st, int pg, int64_t th[2], int32_t slot[2]) {
  const int gid = (threadIdx.x & 31) >> 2;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    th[r] = st.th[pg * 16 + gid + 8 * r];
    slot[r] = st.slot[pg * 16 + gid + 8 * r];
  }
}

// One CTA's share of a unit on one warpgroup (or mma.sync warps): stages the unit's K/V, walks
// `pairs` in tiles and leaves this thread's dK (unscaled) / dV rows in dk / dv; kDq also writes
// the pairs' dq partials. (Its own stage loop and one fused element-wise pass: built on
// walk_pair_stages and unit_scores it ran 5 % slower at m7c_125m 16k, H200 workshop.)
template <int DK, int DV, Branch B, bool kDq, bool kSw = dkdv_wgmma<DK, DV, B>()>
__device__ __forceinline__ void unit_dkdv(const NsaParams& p, const RowTile& unit, int64_t g,
                                          const PairList& pairs, const SelDqPass& dq,
                                          const DkdvSmem<DK, DV, kDq, kSw>& sm, float dk[][4],
                                          float dv[][4]) {
  using Stage = PairStage<DK, DV, true, kSw>;
  constexpr int QT = Stage::QT, SDS = tile_stride(kDkdvUnitRows);
  constexpr int c = static_cast<int>(B);
  const int warp = threadIdx.x >> 5, gid = (threadIdx.x & 31) >> 2, tq = threadIdx.x & 3;
  const int n_pairs = pairs.n;
  load_unit_kv<DK, DV, B, kThreads>(p, unit, g, sm);

  uint32_t entry_ahead = list_entry_ahead<QT>(pairs, 0);  // this thread's entry of the next fill
  const auto issue = [&](int pb, const Stage& st) {
    fill_pair_stage<c, kThreads>(p, pairs, g, pb, entry_ahead, st);
    entry_ahead = list_entry_ahead<QT>(pairs, pb + QT);
  };
  const int jl_lo = warp * 16 + gid;  // this thread's unit rows: jl_lo and jl_lo + 8
  const int j0 = static_cast<int>(unit.first) + warp * 16;  // the warp's first key
  const bool warp_full = warp * 16 + 16 <= unit.rows;
  const MaskParams m = mask_params(p);
  const float sl2 = p.scale * kLog2e;
  const int64_t upb = sel_units_per_block(p.l_sel);
  const int64_t ub = (unit.first % p.l_sel) / kDkdvUnitRows;
  const int n_tiles = (n_pairs + QT - 1) / QT;
  if (n_tiles > 0) issue(0, Stage(sm.stages));
  for (int it = 0; it < n_tiles; ++it) {
    const Stage st(sm.stages + (it & 1) * Stage::kBytes);
    if (it + 1 < n_tiles) {
      issue((it + 1) * QT, Stage(sm.stages + ((it + 1) & 1) * Stage::kBytes));
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    if constexpr (kSw) fence_proxy_async_smem();  // the tiles are read by wgmma
    st.finish_stats();
    __syncthreads();

    float sc[QT / 8][4], dpt[QT / 8][4];
    if constexpr (kSw) {
      wgmma_fence();
      wgmma_tile_bt_issue<DK, QT>(sc, reinterpret_cast<const unsigned char*>(sm.ks),
                                  reinterpret_cast<const unsigned char*>(st.q));
      wgmma_tile_bt_issue<DV, QT>(dpt, reinterpret_cast<const unsigned char*>(sm.vs),
                                  reinterpret_cast<const unsigned char*>(st.d_o));
      wgmma_commit();
      wgmma_wait<0>();
    } else {
#pragma unroll
      for (int nt = 0; nt < QT / 8; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) sc[nt][e] = dpt[nt][e] = 0.0f;
      }
      mma_smem_a_bt<DK, QT / 8>(sc, sm.ks, warp * 16, st.q);
      mma_smem_a_bt<DV, QT / 8>(dpt, sm.vs, warp * 16, st.d_o);
    }
    const int last = it * QT + QT <= n_pairs ? QT - 1 : -1;
    const bool all = warp_full && last >= 0 && all_visible<B>(m, st.t[0], st.t[last], j0, j0 + 15);
    // P and dS; the per-pair visibility test only where the tile is not wholly visible.
    const auto scores = [&](auto whole_tile) {
#pragma unroll
      for (int nt = 0; nt < QT / 8; ++nt) {
        // This thread's two pair columns' statistics, read once per column pair (the ds stores
        // below may alias them for the compiler, which then re-read them per element).
        const int c0 = nt * 8 + 2 * tq;
        const float2 lse2 = *reinterpret_cast<const float2*>(st.lse2 + c0);
        const float2 gate = *reinterpret_cast<const float2*>(st.gate + c0);
        const float2 delta = *reinterpret_cast<const float2*>(st.delta + c0);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int jl = jl_lo + (e >> 1) * 8, col = c0 + (e & 1);
          const float c_lse2 = e & 1 ? lse2.y : lse2.x, c_gate = e & 1 ? gate.y : gate.x;
          const float c_delta = e & 1 ? delta.y : delta.x;
          float pr = fast_exp2(fmaf(sc[nt][e], sl2, -c_lse2));
          if constexpr (!decltype(whole_tile)::value) {
            const int t = st.t[col];
            const bool vis =
                jl < unit.rows && t >= 0 && key_visible<B>(m, t, static_cast<int>(unit.first) + jl);
            pr = vis ? pr : 0.0f;
          }
          sc[nt][e] = pr * c_gate;
          dpt[nt][e] = pr * (c_gate * dpt[nt][e] - c_delta);
          if constexpr (kDq && kSw) {
            *reinterpret_cast<bf16*>(reinterpret_cast<unsigned char*>(sm.ds) +
                                     sw128_offset(col, jl)) = __float2bfloat16(dpt[nt][e]);
          } else if constexpr (kDq) {
            sm.ds[col * SDS + jl] = __float2bfloat16(dpt[nt][e]);
          }
        }
      }
    };
    if (all) {
      scores(std::true_type{});
    } else {
      scores(std::false_type{});
    }
    if constexpr (kSw) {
      uint32_t a_p[QT / 16][4], a_ds[QT / 16][4];
      c_to_a_tile<QT>(a_p, sc);
      c_to_a_tile<QT>(a_ds, dpt);
      wgmma_fence();
      wgmma_p_v_issue<DV, QT>(dv, a_p, reinterpret_cast<const unsigned char*>(st.d_o));
      wgmma_p_v_issue<DK, QT>(dk, a_ds, reinterpret_cast<const unsigned char*>(st.q));
      wgmma_commit();
      wgmma_wait<0>();
    } else {
      mma_c_b<DV, QT / 16>(dv, sc, st.d_o);
      mma_c_b<DK, QT / 16>(dk, dpt, st.q);
    }
    int64_t th[2] = {-1, -1};
    int32_t slot[2] = {0, 0};
    if constexpr (kDq) dq_rows(st, warp % (QT / 16), th, slot);
    if constexpr (kDq && kSw) fence_proxy_async_smem();  // ds is read by wgmma
    __syncthreads();  // stage it & 1 is refilled by the next iteration's issue; ds is complete
    if constexpr (kDq && kSw) {
      sel_tile_dq_wgmma<DK>(p, dq, reinterpret_cast<const unsigned char*>(sm.ds),
                            reinterpret_cast<const unsigned char*>(sm.ks), th, slot, ub, upb);
    } else if constexpr (kDq) {
      sel_tile_dq<DK, QT>(p, dq, sm.ds, sm.ks, th, slot, ub, upb);
    }
  }
}

// unit_dkdv for the widest heads (dkdv_split) on two warpgroups, each thread with one accumulator
// of at most 96 registers where one warpgroup holding dK and dV would need 160: warpgroup 0 takes
// S = K·Qᵀ, P and dV += (g·P)·dO; warpgroup 1 takes dPᵀ = V·dOᵀ, dS (P handed over in shared
// memory: the two warpgroups' accumulators share one layout, so thread t of one reads what
// thread t of the other wrote) and dK += dS·Q; after the tile's barrier the fused dq's 64-column
// blocks split 2 : 1. Per tile the tensor-core work is 5 : 5 (dense branches) or 7 : 6 (selected)
// in units of 64 × 64 × 64.
// acc: dV (warpgroup 0) or dK unscaled (warpgroup 1).
template <int DK, int DV, Branch B, bool kDq>
__device__ __forceinline__ void unit_dkdv_split(const NsaParams& p, const RowTile& unit, int64_t g,
                                                const PairList& pairs, const SelDqPass& dq,
                                                const DkdvSmem<DK, DV, kDq, true>& sm,
                                                float acc[][4]) {
  using Stage = PairStage<DK, DV, true, true>;
  constexpr int QT = Stage::QT, kN = 2 * kThreads, kHandOff = 1;  // named barrier id
  static_assert(DK / 64 == 3 && DV <= DK, "the split is built for dk = 192");
  const int wg = threadIdx.x / kThreads, warp = (threadIdx.x >> 5) & 3, tw = threadIdx.x % kThreads;
  const int64_t upb = sel_units_per_block(p.l_sel);
  const int64_t ub = (unit.first % p.l_sel) / kDkdvUnitRows;
  float4* hand = reinterpret_cast<float4*>(sm.hand);
  const auto* ks = reinterpret_cast<const unsigned char*>(sm.ks);
  const auto* vs = reinterpret_cast<const unsigned char*>(sm.vs);
  load_unit_kv<DK, DV, B, kN>(p, unit, g, sm);
  walk_pair_stages<static_cast<int>(B), kN, Stage>(
      p, pairs, g, sm.stages, [&](int it, const Stage& st) {
        const auto* q = reinterpret_cast<const unsigned char*>(st.q);
        const auto* d_o = reinterpret_cast<const unsigned char*>(st.d_o);
        float s[QT / 8][4], dpt[QT / 8][4];
        uint32_t a[QT / 16][4];
        if (wg == 0) {
          wgmma_fence();
          wgmma_tile_bt_issue<DK, QT>(s, ks, q);
          wgmma_commit();
          wgmma_wait<0>();
          unit_scores<B, kProbs, kDq, true, QT>(p, unit, st, it, pairs.n, warp, s, dpt, sm.ds);
#pragma unroll
          for (int nt = 0; nt < QT / 8; ++nt) {
            hand[nt * kThreads + tw] = make_float4(s[nt][0], s[nt][1], s[nt][2], s[nt][3]);
          }
          unit_scores<B, kGate, kDq, true, QT>(p, unit, st, it, pairs.n, warp, s, dpt, sm.ds);
          c_to_a_tile<QT>(a, s);
          wgmma_fence();
          wgmma_p_v_issue<DV, QT>(acc, a, d_o);
          wgmma_commit();
          // P handed over. dV is already running: warpgroup 1's dPᵀ tends to finish after S and P
          // (a barrier before this product cost the dense kernels 20 %, paper_attn 16k).
          named_barrier_sync(kHandOff, kN);
        } else {
          wgmma_fence();
          wgmma_tile_bt_issue<DV, QT>(dpt, vs, d_o);
          wgmma_commit();
          wgmma_wait<0>();
          named_barrier_sync(kHandOff, kN);
#pragma unroll
          for (int nt = 0; nt < QT / 8; ++nt) {
            const float4 h = hand[nt * kThreads + tw];
            s[nt][0] = h.x, s[nt][1] = h.y, s[nt][2] = h.z, s[nt][3] = h.w;
          }
          unit_scores<B, kDs, kDq, true, QT>(p, unit, st, it, pairs.n, warp, s, dpt, sm.ds);
          c_to_a_tile<QT>(a, dpt);
          wgmma_fence();
          wgmma_p_v_issue<DK, QT>(acc, a, q);
          wgmma_commit();
        }
        int64_t th[2] = {-1, -1};
        int32_t slot[2] = {0, 0};
        if constexpr (kDq) dq_rows(st, warp, th, slot);
        wgmma_wait<0>();
        if constexpr (kDq) fence_proxy_async_smem();  // ds is read by wgmma
        __syncthreads();  // this stage's buffer is refilled by the next step; hand and ds are free
        if constexpr (kDq) {
          const auto* ds = reinterpret_cast<const unsigned char*>(sm.ds);
          if (wg == 0) {
            sel_tile_dq_wgmma<DK, 0, 2>(p, dq, ds, ks, th, slot, ub, upb);
          } else {
            sel_tile_dq_wgmma<DK, 2, 3>(p, dq, ds, ks, th, slot, ub, upb);
          }
        }
      });
}

// This thread's rows of a unit's dK (times scale) / dV (=, or +=): row jl at dst_k + jl·k_stride,
// dst_v + jl·v_stride; a null destination is skipped (a split CTA's thread holds one of them).
template <int DK, int DV>
__device__ __forceinline__ void store_unit(const RowTile& unit, const float dk[][4],
                                           const float dv[][4], float* dst_k, float* dst_v,
                                           int64_t k_stride, int64_t v_stride, float scale,
                                           bool accumulate, bf16* dst_k16, bf16* dst_v16) {
  const int jl_lo = ((threadIdx.x >> 5) & 3) * 16 + ((threadIdx.x & 31) >> 2);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int jl = jl_lo + 8 * r;
    if (jl >= unit.rows) continue;
    if (dst_k) {
      store_rows<DK>(dst_k + jl * k_stride, dst_k16 ? dst_k16 + jl * k_stride : nullptr, dk, r,
                     scale, accumulate);
    }
    if (dst_v) {
      store_rows<DV>(dst_v + jl * v_stride, dst_v16 ? dst_v16 + jl * v_stride : nullptr, dv, r,
                     1.0f, accumulate);
    }
  }
}

// A CTA's dK/dV of one unit: the walk over its pairs and the accumulators it leaves – both in
// every thread (unit_dkdv), or with dkdv_split dK in warpgroup 1 and dV in warpgroup 0, one array.
template <int DK, int DV, Branch B, bool kDq>
struct UnitGrads {
  static constexpr bool kSw = dkdv_wgmma<DK, DV, B>(), kSplit = dkdv_split<DK, DV>();
  using Smem = DkdvSmem<DK, DV, kDq, kSw>;
  float dk[DK / 8][4] = {};
  float dv[kSplit ? 1 : DV / 8][4] = {};  // unused with kSplit

  __device__ void run(const NsaParams& p, const RowTile& unit, int64_t g, const PairList& pairs,
                      const SelDqPass& dq, const Smem& sm) {
    if constexpr (kSplit) {
      unit_dkdv_split<DK, DV, B, kDq>(p, unit, g, pairs, dq, sm, dk);
    } else {
      unit_dkdv<DK, DV, B, kDq>(p, unit, g, pairs, dq, sm, dk, dv);
    }
  }
  // store_unit of this thread's share (bf16 into dst_k16 / dst_v16 where given).
  __device__ void store(const RowTile& unit, float* dst_k, float* dst_v, int64_t k_stride,
                        int64_t v_stride, float scale, bool accumulate, bf16* dst_k16 = nullptr,
                        bf16* dst_v16 = nullptr) const {
    if constexpr (kSplit) {
      const bool holds_k = threadIdx.x >= kThreads;
      store_unit<DK, DV>(unit, dk, dk, holds_k ? dst_k : nullptr, holds_k ? nullptr : dst_v,
                         k_stride, v_stride, scale, accumulate, dst_k16, dst_v16);
    } else {
      store_unit<DK, DV>(unit, dk, dv, dst_k, dst_v, k_stride, v_stride, scale, accumulate, dst_k16,
                         dst_v16);
    }
  }
};

// Every branch, chunked: CTA (unit, g, z) takes chunk z of `chunks` of the unit's queries.
template <int DK, int DV, Branch B>
__global__ void __launch_bounds__(dkdv_threads<DK, DV>(), dkdv_ctas_per_sm(DK))
    dkdv_kernel(const NsaParams p, const RowTile* __restrict__ units, int64_t chunks,
                const DkdvOut out) {
  extern __shared__ __align__(16) unsigned char smem[];
  using Grads = UnitGrads<DK, DV, B, false>;
  const typename Grads::Smem sm(smem);
  const int64_t g = blockIdx.y, z = blockIdx.z, G = p.G;
  const RowTile unit = units[blockIdx.x];
  if (unit.rows == 0) return;  // padding of a device-built table (device_layout.h)
  const UnitQueries u = unit_queries<B>(p, unit, g);
  const PairList pairs =
      chunk_pairs(u, z, chunks, static_cast<int>(p.hpg), static_cast<int>(p.n_sel));
  Grads grads;
  grads.run(p, unit, g, pairs, SelDqPass{0, 0, nullptr}, sm);
  const int64_t key_base =
      B == Branch::kCmp ? p.cmp_offsets[unit.seq] + unit.first : u.seq_start + unit.first;
  const int64_t slot = out.slots > 0 ? z : 0;
  const bool acc = out.slots > 0 ? false : out.accumulate;
  float* dst_k = out.k + (slot * out.rows + key_base) * G * DK + g * DK;
  float* dst_v = out.v + (slot * out.rows + key_base) * G * DV + g * DV;
  bf16* dst_k16 = out.k16 ? out.k16 + key_base * G * DK + g * DK : nullptr;  // slots == 0 only
  bf16* dst_v16 = out.v16 ? out.v16 + key_base * G * DV + g * DV : nullptr;
  grads.store(unit, dst_k, dst_v, G * DK, G * DV, p.scale, acc, dst_k16, dst_v16);
}

// The selected branch's work items of one pass: (unit, group) ug = g·n_units + u has
// item_end[ug] − item_end[ug − 1] items of at most `per_item` index entries each.
struct SelItems {
  const RowTile* units;
  int64_t n_units;
  const int64_t* item_end;  // inclusive prefix sum of the items per (unit, group)
  int64_t per_item;
  float* part;         // [items, 64, dk + dv]: dK (scaled) / dV of the items of multi-item units
  SelItemDesc* items;  // [items]
  SelGradOut out;      // where the pass's sums go
};

// Index entries of (unit, group) ug in the pass's rows.
__device__ __forceinline__ UnitQueries sel_unit_entries(const NsaParams& p, const SelItems& it,
                                                        const SelDqPass& dq, int64_t ug) {
  const int64_t g = ug / it.n_units;
  return unit_queries<Branch::kSel>(p, it.units[ug % it.n_units], g, dq.r0, dq.r1);
}

__global__ void count_items_kernel(const NsaParams p, const SelItems it, const SelDqPass dq,
                                   int64_t* __restrict__ counts) {
  const int64_t ug = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (ug >= it.n_units * p.G) return;
  if (it.units[ug % it.n_units].rows == 0) {  // padding of a device-built table
    counts[ug] = 0;
    return;
  }
  const UnitQueries u = sel_unit_entries(p, it, dq, ug);
  counts[ug] = (u.q_end - u.q_begin + it.per_item - 1) / it.per_item;
}

// Thread ug writes the descriptors of (unit, group) ug's items.
__global__ void fill_items_kernel(const NsaParams p, const SelItems it, const SelDqPass dq) {
  const int64_t ug = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (ug >= it.n_units * p.G || it.units[ug % it.n_units].rows == 0) return;
  const UnitQueries u = sel_unit_entries(p, it, dq, ug);
  const int64_t first = ug > 0 ? it.item_end[ug - 1] : 0, n = it.item_end[ug] - first;
  for (int64_t j = 0; j < n; ++j) {
    const int64_t qa = u.q_begin + j * it.per_item;
    it.items[first + j] = {qa, qa + it.per_item < u.q_end ? qa + it.per_item : u.q_end, ug};
  }
}

// The selected branch fused (dK/dV + dq): CTA i takes work item i. A unit's only item adds its
// dK/dV to the gradient itself; items of units with several write part[i] for reduce_items_kernel.
template <int DK, int DV>
__global__ void __launch_bounds__(dkdv_threads<DK, DV>(), dkdv_ctas_per_sm(DK))
    sel_item_kernel(const NsaParams p, const SelItems it, const SelDqPass dq) {
  extern __shared__ __align__(16) unsigned char smem[];
  using Grads = UnitGrads<DK, DV, Branch::kSel, true>;
  const typename Grads::Smem sm(smem);
  const int64_t i = blockIdx.x, U = it.n_units * p.G;
  if (i >= it.item_end[U - 1]) return;
  const SelItemDesc d = it.items[i];
  const int64_t ug = d.ug, g = ug / it.n_units, first = ug > 0 ? it.item_end[ug - 1] : 0;
  const int64_t n_items = it.item_end[ug] - first;
  const RowTile unit = it.units[ug % it.n_units];
  const UnitQueries u{p.cu_seqlens[unit.seq], d.qa, d.qb, p.sel_entries};
  const int hpg = static_cast<int>(p.hpg);
  const PairList pairs{u, d.qa, static_cast<int>((d.qb - d.qa) * hpg), hpg,
                       static_cast<int>(p.n_sel)};
  Grads grads;
  grads.run(p, unit, g, pairs, dq, sm);
  if (n_items == 1) {
    const int64_t k0 = (u.seq_start + unit.first) * p.G + g;
    grads.store(unit, p.d_k[1] + k0 * DK, p.d_v[1] + k0 * DV, p.G * DK, p.G * DV, p.scale,
                it.out.accumulate, it.out.k16 ? it.out.k16 + k0 * DK : nullptr,
                it.out.v16 ? it.out.v16 + k0 * DV : nullptr);
  } else {
    float* dst = it.part + i * kDkdvUnitRows * (DK + DV);
    grads.store(unit, dst, dst + DK, DK + DV, DK + DV, p.scale, false);
  }
}

// d_k[1] / d_v[1] (=, or += with out.accumulate; in bf16 into out.k16 / out.v16 where given) Σ
// items of each multi-item (unit, group), in item order (four running sums so that four loads are
// in flight, added in a fixed order): CTA (ug, y) takes unit rows y·kReduceRows.. of ug.
constexpr int kReduceRows = 8;
template <int DK, int DV>
__global__ void reduce_items_kernel(const NsaParams p, const SelItems it) {
  const int64_t ug = blockIdx.x, first = ug > 0 ? it.item_end[ug - 1] : 0;
  const int64_t n_items = it.item_end[ug] - first;
  if (n_items < 2) return;
  const RowTile unit = it.units[ug % it.n_units];
  const int64_t g = ug / it.n_units, row0 = p.cu_seqlens[unit.seq] + unit.first;
  constexpr int W = DK + DV;
  constexpr int64_t kItem = kDkdvUnitRows * W;
  const int r_end = min(unit.rows, static_cast<int>(blockIdx.y + 1) * kReduceRows);
  for (int idx = blockIdx.y * kReduceRows * W + threadIdx.x; idx < r_end * W; idx += blockDim.x) {
    const int jl = idx / W, col = idx % W;
    const float* src = it.part + first * kItem + idx;
    float a[4] = {};
    int64_t k = 0;
    for (; k + 4 <= n_items; k += 4) {
#pragma unroll
      for (int u = 0; u < 4; ++u) a[u] += src[(k + u) * kItem];
    }
    for (; k < n_items; ++k) a[0] += src[k * kItem];
    float acc = (a[0] + a[1]) + (a[2] + a[3]);
    const int64_t at =
        col < DK ? ((row0 + jl) * p.G + g) * DK + col : ((row0 + jl) * p.G + g) * DV + (col - DK);
    float* dst = (col < DK ? p.d_k[1] : p.d_v[1]) + at;
    if (it.out.accumulate) acc = *dst + acc;
    bf16* dst16 = col < DK ? it.out.k16 : it.out.v16;
    if (dst16) {
      dst16[at] = __float2bfloat16(acc);
    } else {
      *dst = acc;
    }
  }
}

// out (=, or +=) Σ_z partial[z], in chunk order; into out16 in bf16 instead where given.
__global__ void sum_chunks_kernel(const float* __restrict__ partial, float* __restrict__ out,
                                  bf16* __restrict__ out16, int64_t n, int64_t chunks,
                                  bool accumulate) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float acc = accumulate ? out[i] : 0.0f;
  for (int64_t z = 0; z < chunks; ++z) acc += partial[z * n + i];
  if (out16) {
    out16[i] = __float2bfloat16(acc);
  } else {
    out[i] = acc;
  }
}

template <Branch B>
void launch_branch(const NsaParams& p, const RowTile* units, int64_t n_units, int64_t chunks,
                   const DkdvOut& out, cudaStream_t stream) {
  if (n_units == 0) return;
  dispatch_head_dims(p.dk, p.dv, [&](auto DK, auto DV) {
    const auto kernel = dkdv_kernel<DK(), DV(), B>;
    const size_t smem = dkdv_smem_bytes<DK(), DV(), false, dkdv_wgmma<DK(), DV(), B>()>();
    set_kernel_smem(kernel, smem);
    const dim3 grid(static_cast<unsigned>(n_units), static_cast<unsigned>(p.G),
                    static_cast<unsigned>(chunks));
    kernel<<<grid, dkdv_threads<DK(), DV()>(), smem, stream>>>(p, units, chunks, out);
    NSA_CUDA_LAUNCH_CHECK();
  });
}

// The gradient rows of a branch.
DkdvOut branch_out(const NsaParams& p, Branch branch) {
  switch (branch) {
    case Branch::kWin:
      return {p.d_k[2], p.d_v[2], p.T, 0, false, p.d_k_bf16[2], p.d_v_bf16[2]};
    case Branch::kSel:
      return {p.d_k[1], p.d_v[1], p.T, 0, false, p.d_k_bf16[1], p.d_v_bf16[1]};
    case Branch::kCmp:
      break;
  }
  return {p.d_k_cmp, p.d_v_cmp, p.C, 0, false};
}

// out (=, or +=) Σ of `slots` partial slots, in slot order.
void sum_partials(const NsaParams& p, const DkdvOut& out, int64_t slots, const float* partial,
                  cudaStream_t stream) {
  const int64_t nk = out.rows * p.G * p.dk, nv = out.rows * p.G * p.dv;
  if (nk == 0) return;
  sum_chunks_kernel<<<static_cast<unsigned>((nk + 255) / 256), 256, 0, stream>>>(
      partial, out.k, out.k16, nk, slots, out.accumulate);
  NSA_CUDA_LAUNCH_CHECK();
  sum_chunks_kernel<<<static_cast<unsigned>((nv + 255) / 256), 256, 0, stream>>>(
      partial + slots * nk, out.v, out.v16, nv, slots, out.accumulate);
  NSA_CUDA_LAUNCH_CHECK();
}

}  // namespace

void launch_nsa_backward_dkdv(const NsaParams& p, Branch branch, const RowTile* units,
                              int64_t n_units, int64_t chunks, bool accumulate, float* partial,
                              cudaStream_t stream) {
  if (n_units == 0) return;
  DkdvOut direct = branch_out(p, branch);
  direct.accumulate = accumulate;
  DkdvOut out = direct;
  if (chunks > 1)  // fp32 partial slots; the sum writes the gradient (bf16 where wanted)
    out = {partial, partial + chunks * direct.rows * p.G * p.dk, direct.rows, chunks, false};
  switch (branch) {
    case Branch::kWin:
      launch_branch<Branch::kWin>(p, units, n_units, chunks, out, stream);
      break;
    case Branch::kSel:
      launch_branch<Branch::kSel>(p, units, n_units, chunks, out, stream);
      break;
    case Branch::kCmp:
      launch_branch<Branch::kCmp>(p, units, n_units, chunks, out, stream);
      break;
  }
  if (chunks > 1) sum_partials(p, direct, chunks, partial, stream);
}

int64_t sel_items_bound(const NsaParams& p, int64_t n_units, int64_t rows) {
  return rows * p.G * p.n_sel / sel_entries_per_item(p) + n_units * p.G;
}

int64_t sel_entries_per_item(const NsaParams& p) {
  return std::max<int64_t>(1, kSelItemPairs / p.hpg);
}

void launch_sel_dkdv_dq(const NsaParams& p, const RowTile* units, int64_t n_units,
                        const SelDqPass& pass, const SelGradOut& out, const SelItemScratch& s,
                        cudaStream_t stream) {
  const int64_t U = n_units * p.G;
  if (U == 0) return;
  const SelItems it{units, n_units, s.item_end, sel_entries_per_item(p), s.part, s.items, out};
  count_items_kernel<<<static_cast<unsigned>((U + 255) / 256), 256, 0, stream>>>(p, it, pass,
                                                                                 s.counts);
  NSA_CUDA_LAUNCH_CHECK();
  size_t temp = s.scan_temp_bytes;
  NSA_CUDA_CHECK(cub::DeviceScan::InclusiveSum(s.scan_temp, temp, s.counts, s.item_end,
                                               static_cast<int>(U), stream));
  fill_items_kernel<<<static_cast<unsigned>((U + 255) / 256), 256, 0, stream>>>(p, it, pass);
  NSA_CUDA_LAUNCH_CHECK();
  const int64_t bound = sel_items_bound(p, n_units, pass.r1 - pass.r0);
  dispatch_head_dims(p.dk, p.dv, [&](auto DK, auto DV) {
    const auto kernel = sel_item_kernel<DK(), DV()>;
    const size_t smem = dkdv_smem_bytes<DK(), DV(), true, dkdv_wgmma<DK(), DV(), Branch::kSel>()>();
    set_kernel_smem(kernel, smem);
    kernel<<<static_cast<unsigned>(bound), dkdv_threads<DK(), DV()>(), smem, stream>>>(p, it, pass);
    NSA_CUDA_LAUNCH_CHECK();
    const dim3 reduce_grid(static_cast<unsigned>(U), kDkdvUnitRows / kReduceRows);
    reduce_items_kernel<DK(), DV()><<<reduce_grid, 256, 0, stream>>>(p, it);
    NSA_CUDA_LAUNCH_CHECK();
  });
}

size_t sel_scan_temp_bytes(int64_t n) {
  size_t temp = 0;
  NSA_CUDA_CHECK(cub::DeviceScan::InclusiveSum(nullptr, temp, static_cast<const int64_t*>(nullptr),
                                               static_cast<int64_t*>(nullptr),
                                               static_cast<int>(n)));
  return temp;
}

}  // namespace nsa::cuda
