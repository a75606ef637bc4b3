// The selected branch block-major (v3, see sel_block_major.h): one selection block staged in shared
// memory serves every (query, head) pair of a CTA's entries that chose it, so each block is read
// once per ~256 pairs instead of once per (query, group), and the MMA tiles are full whatever the
// group size. The price is one partial result per (row, head, slot) in device memory and a merge.
// For head dims that are multiples of 64 the CTA's four warps run the pairs as 64-row warpgroup
// MMA tiles over the block's swizzled sub-tiles (wgmma_tiles.cuh), the pairs' Q rows staged in
// shared memory a tile ahead (pair_tiles.cuh); otherwise each warp its own 16-pair mma.sync tiles.
//
// Forward partial: the block's softmax state of the pair – o_k normalised over the block's
// visible keys (bf16) and lse_k (fp32, natural log). Merge: o = Σ_k e^(lse_k − lse) o_k with
// lse = log Σ_k e^(lse_k), slots in ascending order. The backward's dq partials come from the
// selected dK/dV kernel (nsa_backward_dkdv.cu), one per (row, head, slot, unit of the block):
// Σ_j dS_j k_j over the unit's keys (unscaled, bf16); merge: d_q += scale · Σ partials, slots and
// units in ascending order.
#include <algorithm>

#include "common/block_reduce.cuh"
#include "common/cuda_check.h"
#include "head_dims.h"
#include "nsa_backward_dkdv.h"
#include "nsa_kernels.h"
#include "pair_tiles.cuh"
#include "sel_block_major.h"
#include "sel_index.h"
#include "softmax.cuh"
#include "tiles.cuh"
#include "wgmma_tiles.cuh"

namespace nsa::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kPairTile = 16 * kWarps;  // (entry, head) pairs per CTA tile: 16 MMA rows a warp
constexpr int kPairsPerCta = 256;       // a CTA takes kPairsPerCta / hpg entries (at least 1) …
constexpr int kWideGroupPairsPerCta = 1024;  // … or this many pairs for groups of 16+ heads
constexpr uint64_t kPadKey = ~0ull;

// Groups of 16 or more heads take four times the pairs (a CTA's entries were only 16): measured
// (H100 workshop, sel_fwd_block with sort and merge) paper_attn 16k 6.95 -> 6.62-6.69 ms, 32k
// 14.15 -> 13.50. At m7c_125m (6 heads) 1,024 pairs lost at 64k (2.52 -> 2.61 ms, docs/perf.md).
int entries_per_cta(int64_t hpg) {
  const int64_t pairs = hpg >= 16 ? kWideGroupPairsPerCta : kPairsPerCta;
  return static_cast<int>(std::max<int64_t>(1, pairs / hpg));
}

// Block rows per shared sub-tile: 32 for the widest heads keeps dq, Q, dO, S and dP in registers
// (mma.sync); 64 on warpgroup MMA (head dims multiples of 64: the block as swizzled 64-row
// sub-tiles, one 64-pair tile of the CTA's four warps as M).
template <int DK, int DV>
constexpr int key_tile() {
  return wgmma_dims(DK, DV) ? 64 : DK > 128 ? 32 : 64;
}

// On warpgroup MMA the pairs' Q rows arrive as swizzled 64-pair stages (pair_tiles.cuh), two in
// flight: the next tile's rows load while this one's products run.
template <int DK, int DV>
using QStage = PairStage<DK, DV, false, true>;

template <int DK, int DV>
size_t smem_bytes(const NsaParams& p, int ne) {
  constexpr int KT = key_tile<DK, DV>();
  const int64_t rows = (p.l_sel + KT - 1) / KT * KT;
  const size_t tiles =
      wgmma_dims(DK, DV)
          ? kSwAlignSlack + static_cast<size_t>(rows * (DK + DV)) * sizeof(bf16) +
                2 * QStage<DK, DV>::kBytes
          : static_cast<size_t>(rows * (tile_stride(DK) + tile_stride(DV))) * sizeof(bf16);
  return tiles + static_cast<size_t>(ne) * sizeof(uint64_t);
}

struct ChunkArgs {
  const uint64_t* keys;  // sorted (launch_sel_keys, sort_sel_keys); padding last
  int64_t n;             // keys
  int64_t r0;            // first query row of the chunk
  int ne;                // entries per CTA
  bf16* part;            // [rows, H, n_sel, dv]
  float* part_lse;       // [rows, H, n_sel]
};

// What one thread needs of its two MMA rows (gid, gid + 8) of a pair tile.
struct PairRows {
  bool ok[2];
  int64_t th[2];    // row·H + head
  int64_t part[2];  // ((row − r0)·H + head)·n_sel + slot
  int64_t t[2];     // position in the sequence
};

__device__ __forceinline__ PairRows pair_rows(const NsaParams& p, const ChunkArgs& a,
                                              const uint64_t* key_s, int run_begin, int pairs,
                                              int pair0, int64_t g, int64_t seq_start) {
  PairRows pr;
  const int gid = (threadIdx.x & 31) >> 2;
  const int hpg = static_cast<int>(p.hpg), n_sel = static_cast<int>(p.n_sel);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int pair = pair0 + gid + 8 * r;
    pr.ok[r] = pair < pairs;
    const int safe = pr.ok[r] ? pair : 0;
    // 32-bit divisions: a chunk's local index and the head count fit.
    const uint32_t entry = static_cast<uint32_t>(key_s[run_begin + safe / hpg]);
    const uint32_t row = entry / static_cast<uint32_t>(n_sel);
    const int slot = static_cast<int>(entry - row * static_cast<uint32_t>(n_sel));
    const int64_t head = g * hpg + safe % hpg;
    pr.th[r] = row * p.H + head;
    pr.part[r] = (pr.th[r] - a.r0 * p.H) * n_sel + slot;
    pr.t[r] = row - seq_start;
  }
  return pr;
}

// Scales a sub-tile's scores to the log2 domain, −inf where the key is past the block's valid rows
// or after the row's own position.
template <int NT>
__device__ __forceinline__ void mask_block(float s[][4], const PairRows& pr, int kbase, int nk,
                                           int64_t k_first, float sl2) {
  const int tq = threadIdx.x & 3;
  int lim[2];  // row r sees the block's keys kk < lim[r]
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t own = pr.t[r] - k_first + 1;
    lim[r] = !pr.ok[r] ? 0 : (own < nk ? static_cast<int>(own) : nk);
  }
  if (kbase + NT * 8 <= (lim[0] < lim[1] ? lim[0] : lim[1])) {  // the whole sub-tile is visible
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
      const int kk = kbase + nt * 8 + 2 * tq + (e & 1);
      s[nt][e] = kk < lim[e >> 1] ? s[nt][e] * sl2 : -INFINITY;
    }
  }
}

// One row half of a warp's 16 × D accumulator → dst (bf16), times `scale`.
template <int D>
__device__ __forceinline__ void store_part(bf16* dst, const float acc[][4], int r, float scale) {
  const int tq = threadIdx.x & 3;
#pragma unroll
  for (int nt = 0; nt < D / 8; ++nt) {
    *reinterpret_cast<uint32_t*>(dst + nt * 8 + 2 * tq) =
        pack_bf16(scale * acc[nt][2 * r], scale * acc[nt][2 * r + 1]);
  }
}

// A pair tile's partials: o normalised (bf16) and lse, for this thread's two rows.
template <int DV>
__device__ __forceinline__ void store_pair_rows(const ChunkArgs& a, const PairRows& pr,
                                                const SoftmaxAcc<DV>& acc) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (!pr.ok[r]) continue;
    store_part<DV>(a.part + pr.part[r] * DV, acc.o, r, acc.inv(r));
    if ((threadIdx.x & 3) == 0) a.part_lse[pr.part[r]] = acc.lse(r);
  }
}

// One run's pairs (entries [q_begin, q_begin + pairs / hpg) of a.keys, all of one block) on
// warpgroup MMA, in 64-pair tiles whose Q rows arrive as swizzled stages, the next tile's while
// this one's products run (the Q rows are gathered from all over the chunk: loaded into registers
// on demand, their latency was a quarter of the kernel's stall samples). The block's K/V tiles,
// issued by the caller, complete with the first stage.
template <int DK, int DV>
__device__ __forceinline__ void staged_run(const NsaParams& p, const ChunkArgs& a,
                                           const unsigned char* ks, const unsigned char* vs,
                                           unsigned char* stages, int n_sub, int nk,
                                           int64_t k_first, int64_t q_begin, int pairs, int64_t g,
                                           int64_t seq_start) {
  using Stage = QStage<DK, DV>;
  constexpr int QT = Stage::QT, KT = key_tile<DK, DV>();
  constexpr int K_SUB = KT * DK * 2, V_SUB = KT * DV * 2;
  static_assert(QT == kPairTile && KT == 64, "64-pair tiles over 64-row sub-tiles");
  const int hpg = static_cast<int>(p.hpg), n_sel = static_cast<int>(p.n_sel);
  const UnitQueries u{seq_start, q_begin, q_begin + pairs / hpg, a.keys};
  const PairList list{u, q_begin, pairs, hpg, n_sel};
  const int row_lo = (threadIdx.x >> 5) * 16 + ((threadIdx.x & 31) >> 2);
  const float sl2 = p.scale * kLog2e;
  walk_pair_stages<1, kThreads, Stage>(p, list, g, stages, [&](int, const Stage& st) {
    PairRows pr;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = row_lo + 8 * r;
      pr.th[r] = st.th[row];
      pr.ok[r] = pr.th[r] >= 0;
      pr.t[r] = st.t[row];
      pr.part[r] = (pr.th[r] - a.r0 * p.H) * n_sel + st.slot[row];
    }
    SoftmaxAcc<DV> acc;
    acc.init();
    for (int sub = 0; sub < n_sub && sub * KT < nk; ++sub) {
      float s[KT / 8][4];
      wgmma_fence();
      wgmma_tile_bt_issue<DK, KT>(s, reinterpret_cast<const unsigned char*>(st.q),
                                  ks + sub * K_SUB);
      wgmma_commit();
      wgmma_wait<0>();
      mask_block<KT / 8>(s, pr, sub * KT, nk, k_first, sl2);
      acc.template update<KT / 8>(s);
      wgmma_p_v<DV, KT>(acc.o, s, vs + sub * V_SUB);
    }
    acc.finish();
    store_pair_rows<DV>(a, pr, acc);
    __syncthreads();  // this stage's buffer is refilled by the next step's fill
  });
}

// Five CTAs per SM up to 64-wide heads: 127 registers a thread allowed four; capped at 102 (20
// bytes of spills) the fifth fits beside the shared memory. Measured (H100 workshop, sel_fwd_block
// with its sort and merge, m7c_125m): 8k 0.346 -> 0.335 ms, 16k 0.621 -> 0.612, 64k 2.518 -> 2.483;
// at six (80 registers) the spills grow to 340 bytes.
template <int DK>
constexpr int sel_block_major_min_ctas() {
  return DK <= 64 ? 5 : 1;
}

template <int DK, int DV>
__global__ void __launch_bounds__(kThreads, sel_block_major_min_ctas<DK>())
    sel_block_major_kernel(const NsaParams p, const ChunkArgs a) {
  constexpr bool kWgmma = wgmma_dims(DK, DV);
  constexpr int KT = key_tile<DK, DV>(), SK = tile_stride(DK), SV = tile_stride(DV);
  // Sub-tile of KT block rows: K (K_SUB bytes) and V (V_SUB bytes) apart.
  constexpr int K_SUB = KT * (kWgmma ? DK : SK) * 2, V_SUB = KT * (kWgmma ? DV : SV) * 2;
  extern __shared__ __align__(16) unsigned char smem[];
  const int n_sub = static_cast<int>((p.l_sel + KT - 1) / KT);
  unsigned char* ks = kWgmma ? sw_align(smem) : smem;
  unsigned char* vs = ks + n_sub * K_SUB;
  unsigned char* stages = vs + n_sub * V_SUB;  // wgmma: two Q stages (1024-aligned)
  uint64_t* key_s = reinterpret_cast<uint64_t*>(stages + (kWgmma ? 2 * QStage<DK, DV>::kBytes : 0));

  const int64_t e0 = static_cast<int64_t>(blockIdx.x) * a.ne;
  const int n_here = static_cast<int>(a.n - e0 < a.ne ? a.n - e0 : a.ne);
  for (int i = threadIdx.x; i < n_here; i += kThreads) key_s[i] = a.keys[e0 + i];
  __syncthreads();
  const int warp = threadIdx.x >> 5;
  const float sl2 = p.scale * kLog2e;

  for (int i = 0; i < n_here;) {
    const uint64_t key0 = key_s[i];
    if (key0 == kPadKey) break;
    const uint64_t seg = key0 >> 32;
    // The run's end: the first key of a later segment (binary search: block 0's run can span
    // the whole chunk, and every thread finds the end).
    int j = i + 1;
    for (int hi = n_here; j < hi;) {
      const int mid = j + (hi - j) / 2;
      if ((key_s[mid] >> 32) == seg) {
        j = mid + 1;
      } else {
        hi = mid;
      }
    }
    // Entries [i, j) chose block `blk` of group g in sequence n.
    const int64_t g = static_cast<int64_t>(seg) / p.TB;
    const int64_t row0 = static_cast<int64_t>(key0 & 0xffffffffu) / p.n_sel;
    const int64_t n = p.seq_of_row[row0], seq_start = p.cu_seqlens[n];
    const int64_t blk = static_cast<int64_t>(seg) % p.TB - p.blk_offsets[n];
    const int64_t k_first = blk * p.l_sel, len = p.cu_seqlens[n + 1] - seq_start;
    const int nk = static_cast<int>(p.l_sel < len - k_first ? p.l_sel : len - k_first);
    const KvRows kv = raw_rows(p, 1, n, g);
    if constexpr (kWgmma) {
      for (int sub = 0; sub < n_sub; ++sub) {
        const int r0 = sub * KT;
        load_sw_tile<DK, KT, kThreads>(
            ks + sub * K_SUB,
            [&](int r) { return r0 + r < nk ? kv.k + (k_first + r0 + r) * kv.k_stride : nullptr; },
            threadIdx.x);
        load_sw_tile<DV, KT, kThreads>(
            vs + sub * V_SUB,
            [&](int r) { return r0 + r < nk ? kv.v + (k_first + r0 + r) * kv.v_stride : nullptr; },
            threadIdx.x);
      }
    } else {
      load_tile<DK, true>(
          reinterpret_cast<bf16*>(ks), n_sub * KT,
          [&](int r) { return r < nk ? kv.k + (k_first + r) * kv.k_stride : nullptr; }, threadIdx.x,
          kThreads);
      load_tile<DV, true>(
          reinterpret_cast<bf16*>(vs), n_sub * KT,
          [&](int r) { return r < nk ? kv.v + (k_first + r) * kv.v_stride : nullptr; }, threadIdx.x,
          kThreads);
    }
    const int pairs = (j - i) * static_cast<int>(p.hpg);
    if constexpr (kWgmma) {
      // The block's K/V are committed with the first stage of Q rows.
      staged_run<DK, DV>(p, a, ks, vs, stages, n_sub, nk, k_first, e0 + i, pairs, g, seq_start);
    } else {
      cp_async_commit();
      // The warp's first tile loads its queries while the block is on its way.
      PairRows pr = pair_rows(p, a, key_s, i, pairs, warp * 16, g, seq_start);
      uint32_t qf[DK / 16][4];
      const auto load_q = [&] {
        load_a_rows<DK>(qf, [&](int m) -> const bf16* {
          return pr.ok[m >> 3] ? p.q + pr.th[m >> 3] * DK : nullptr;
        });
      };
      load_q();
      cp_async_wait<0>();
      __syncthreads();
      // Each warp walks its own 16-pair tiles.
      for (int pair0 = warp * 16; pair0 < pairs; pair0 += kPairTile) {
        if (pair0 != warp * 16) {
          pr = pair_rows(p, a, key_s, i, pairs, pair0, g, seq_start);
          load_q();
        }
        SoftmaxAcc<DV> acc;
        acc.init();
        for (int sub = 0; sub < n_sub && sub * KT < nk; ++sub) {
          float s[KT / 8][4];
#pragma unroll
          for (int nt = 0; nt < KT / 8; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
          mma_a_bt<DK, KT / 8>(s, qf, reinterpret_cast<const bf16*>(ks + sub * K_SUB));
          mask_block<KT / 8>(s, pr, sub * KT, nk, k_first, sl2);
          acc.template update<KT / 8>(s);
          mma_c_b<DV, KT / 16>(acc.o, s, reinterpret_cast<const bf16*>(vs + sub * V_SUB));
        }
        acc.finish();
        store_pair_rows<DV>(a, pr, acc);
      }
    }
    __syncthreads();  // the block's tiles are refilled by the next run
    i = j;
  }
}

// Columns per lane of the merge kernels (the lanes past D / per are idle for D < 64).
template <int D>
constexpr int merge_cols() {
  return D >= 64 ? D / 32 : 2;
}

// acc += weight(a) · row a of src (row a at src + a·stride) for the set bits a of the warp-uniform
// `mask`, in ascending order, four rows' loads in flight. Every lane calls it (weight may
// shuffle); lanes with !active only keep the warp together.
template <int kPer, typename Weight>
__device__ __forceinline__ void add_rows_in_order(float acc[kPer], const bf16* src, int64_t stride,
                                                  uint32_t mask, bool active, Weight weight) {
  while (mask != 0) {
    int a[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      a[u] = mask != 0 ? __ffs(mask) - 1 : -1;
      mask &= mask - 1;
    }
    __nv_bfloat162 x[4][kPer / 2];
    float wt[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      wt[u] = weight(a[u] < 0 ? 0 : a[u]);
      if (active && a[u] >= 0) {
#pragma unroll
        for (int c = 0; c < kPer / 2; ++c) {
          x[u][c] = reinterpret_cast<const __nv_bfloat162*>(src + a[u] * stride)[c];
        }
      }
    }
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      if (!active || a[u] < 0) continue;
#pragma unroll
      for (int c = 0; c < kPer / 2; ++c) {
        const float2 f = __bfloat1622float2(x[u][c]);
        acc[2 * c] += wt[u] * f.x;
        acc[2 * c + 1] += wt[u] * f.y;
      }
    }
  }
}

// The (row, head) pair of this warp in a merge kernel (one warp per pair of rows r0, r0 + 1, …):
// 32-bit indices (a chunk's rows·H fits; the launchers check), since with 64-bit divisions the
// merges were issue-bound. w is the pair's index in the chunk; the caller stops at rows·H.
struct MergeRow {
  int w, lane;
  int64_t row, th;     // query row, row·H + head
  const int32_t* sel;  // the row's selected blocks of the head's group
};
__device__ __forceinline__ MergeRow merge_row(const NsaParams& p, int64_t r0) {
  MergeRow m;
  const int H = static_cast<int>(p.H);
  m.w = static_cast<int>((static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5);
  m.lane = threadIdx.x & 31;
  const int rl = m.w / H, h = m.w - rl * H, g = h / static_cast<int>(p.hpg);
  m.row = r0 + rl;
  m.th = m.row * H + h;
  m.sel = p.sel_idx + (m.row * p.G + g) * p.n_sel;
  return m;
}

// One warp per (row, head) of rows [r0, r0 + rows): o_sel and lse_sel from the slots' partials.
// Lane k takes slot i0 + k's lse and weight; the partial rows are then added in slot order, four
// loads in flight (with a slot loop of dependent loads and 64-bit divisions the kernel was
// issue-bound: Nsight Compute, 80 % SM throughput at 60 % of the memory's).
// combine: also o = g_cmp·o_cmp + g_sel·(this, unrounded) + g_win·o_win (the window branch ran
// before without combining: it may run beside this branch, nsa_launch.cpp).
template <int DV>
__global__ void merge_forward_kernel(const NsaParams p, int64_t r0, int rows,
                                     const bf16* __restrict__ part,
                                     const float* __restrict__ part_lse, bool combine) {
  constexpr int kPer = merge_cols<DV>();
  const int n_sel = static_cast<int>(p.n_sel);
  const MergeRow mr = merge_row(p, r0);
  if (mr.w >= rows * p.H) return;  // warp-uniform
  const int w = mr.w, lane = mr.lane;
  const int64_t th = mr.th;
  const int32_t* sel = mr.sel;
  const float* pl = part_lse + static_cast<int64_t>(w) * n_sel;
  const bf16* src = part + static_cast<int64_t>(w) * n_sel * DV + lane * kPer;
  float m = -INFINITY;
  for (int i0 = 0; i0 < n_sel; i0 += 32) {
    const int k = i0 + lane;
    if (k < n_sel && sel[k] >= 0) m = fmaxf(m, pl[k]);
  }
  m = warp_max(m);
  float acc[kPer] = {}, sum = 0.0f;
  for (int i0 = 0; i0 < n_sel; i0 += 32) {
    const int k = i0 + lane;
    const bool ok = k < n_sel && sel[k] >= 0;
    const float wk = ok ? exp2f((pl[k] - m) * kLog2e) : 0.0f;
    sum += wk;
    add_rows_in_order<kPer>(acc, src + static_cast<int64_t>(i0) * DV, DV,
                            __ballot_sync(0xffffffffu, ok), lane * kPer < DV,
                            [&](int a) { return __shfl_sync(0xffffffffu, wk, a); });
  }
  sum = warp_sum(sum);
  if (lane * kPer < DV) {
    const int64_t at = th * DV + lane * kPer;
    const float inv = 1.0f / sum;
#pragma unroll
    for (int c = 0; c < kPer; c += 2) {
      *reinterpret_cast<__nv_bfloat162*>(p.o_branch[1] + at + c) =
          __floats2bfloat162_rn(acc[c] * inv, acc[c + 1] * inv);
    }
    if (combine) {
      const float g_cmp = __bfloat162float(p.gate[0][th]), g_sel = __bfloat162float(p.gate[1][th]);
      const float g_win = __bfloat162float(p.gate[2][th]);
#pragma unroll
      for (int c = 0; c < kPer; c += 2) {
        const float2 oc =
            __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(p.o_branch[0] + at + c));
        const float2 ow =
            __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(p.o_branch[2] + at + c));
        *reinterpret_cast<__nv_bfloat162*>(p.o + at + c) =
            __floats2bfloat162_rn(g_cmp * oc.x + g_sel * (acc[c] * inv) + g_win * ow.x,
                                  g_cmp * oc.y + g_sel * (acc[c + 1] * inv) + g_win * ow.y);
      }
    }
  }
  if (lane == 0) p.lse[1][th] = m + logf(sum);
}

// One warp per (row, head): d_q += scale · Σ partials over the valid slots and, within a slot's
// block, the units up to the row's own position (later units saw no key of it), in (slot, unit)
// order.
template <int DK>
__global__ void merge_dq_kernel(const NsaParams p, int64_t r0, int rows,
                                const bf16* __restrict__ part) {
  constexpr int kPer = merge_cols<DK>();
  const MergeRow mr = merge_row(p, r0);
  if (mr.w >= rows * p.H) return;  // warp-uniform
  const int w = mr.w, lane = mr.lane;
  const int64_t row = mr.row, th = mr.th;
  const int64_t t = row - p.cu_seqlens[p.seq_of_row[row]];
  const int32_t* sel = mr.sel;
  const int upb = static_cast<int>(sel_units_per_block(p.l_sel));
  const int n = static_cast<int>(p.n_sel) * upb;
  const int col = lane * kPer;
  const bf16* src = part + static_cast<int64_t>(w) * n * DK + col;
  float acc[kPer] = {};
  // Which (slot, unit) pairs count is worked out by the lanes in parallel (lane i: pair i0 + i);
  // the partials are then added in ascending order, several loads in flight.
  for (int i0 = 0; i0 < n; i0 += 32) {
    const int i = i0 + lane;
    const int32_t b = i < n ? sel[i / upb] : -1;
    const uint32_t mask =
        __ballot_sync(0xffffffffu, b >= 0 && b * p.l_sel + (i % upb) * kDkdvUnitRows <= t);
    add_rows_in_order<kPer>(acc, src + static_cast<int64_t>(i0) * DK, DK, mask, col < DK,
                            [](int) { return 1.0f; });
  }
  if (col >= DK) return;
  float* dst = p.d_q + th * DK + col;
  static_assert(kPer % 2 == 0, "bf16 pairs");
  float v[kPer];  // one fused multiply-add each, so the fp32 and bf16 results agree
#pragma unroll
  for (int c = 0; c < kPer; ++c) v[c] = __fmaf_rn(p.scale, acc[c], dst[c]);
  if (p.d_q_bf16) {  // the caller wants bf16 gradients: this kernel finishes d_q, fp32 unwritten
    auto* out = reinterpret_cast<__nv_bfloat162*>(p.d_q_bf16 + th * DK + col);
#pragma unroll
    for (int c = 0; c < kPer; c += 2) out[c / 2] = __floats2bfloat162_rn(v[c], v[c + 1]);
    return;
  }
#pragma unroll
  for (int c = 0; c < kPer; ++c) dst[c] = v[c];
}

// Sorted keys of rows [r0, r0 + rows) in v.keys_out; returns their count (padding included).
int64_t sort_chunk(const NsaParams& p, const SelBlockMajorView& v, int64_t r0, int64_t rows,
                   cudaStream_t stream) {
  const int64_t n = rows * p.G * p.n_sel;
  launch_sel_keys(p, r0, rows, v.keys_in, stream);
  sort_sel_keys(p, v.keys_in, v.keys_out, n, v.temp, v.temp_bytes, stream);
  return n;
}

}  // namespace

int64_t sel_partial_bytes_per_row(int64_t H, int64_t n_sel, int64_t l_sel, int64_t dk, int64_t dv) {
  const int64_t upb = sel_units_per_block(l_sel);
  const int64_t fwd = H * n_sel * (dv * int64_t{sizeof(bf16)} + int64_t{sizeof(float)});
  const int64_t bwd = H * n_sel * upb * dk * int64_t{sizeof(bf16)};
  return std::max(fwd, bwd);
}

SelBlockMajorView carve_sel_block_major(const NsaParams& p, int64_t partial_budget_bytes,
                                        int64_t n_sel_units, Workspace& ws) {
  SelBlockMajorView v;
  if (p.T == 0) return v;
  const int64_t per_row = sel_partial_bytes_per_row(p.H, p.n_sel, p.l_sel, p.dk, p.dv);
  v.rows = std::min(p.T, std::max<int64_t>(1, partial_budget_bytes / per_row));
  const int64_t n = v.rows * p.G * p.n_sel;
  const int64_t upb = sel_units_per_block(p.l_sel);
  v.keys_in = ws.take<uint64_t>(n);
  v.keys_out = ws.take<uint64_t>(n);
  v.part = ws.take<bf16>(v.rows * p.H * p.n_sel * std::max(p.dv, upb * p.dk));
  v.part_lse = ws.take<float>(v.rows * p.H * p.n_sel);
  v.temp_bytes = sel_sort_temp_bytes(p, n);  // the largest chunk's (the last may need less)
  v.temp = ws.take_bytes(v.temp_bytes);
  // The backward's work items.
  const int64_t U = n_sel_units * p.G;
  v.n_units = n_sel_units;
  v.counts = ws.take<int64_t>(U);
  v.item_end = ws.take<int64_t>(U);
  v.scan_temp_bytes = sel_scan_temp_bytes(U);
  v.scan_temp = ws.take_bytes(v.scan_temp_bytes);
  const int64_t bound = sel_items_bound(p, n_sel_units, v.rows);
  v.item_part = ws.take<float>(bound * kDkdvUnitRows * (p.dk + p.dv));
  v.items = ws.take<SelItemDesc>(bound);
  return v;
}

SelBlockMajorView SelBlockMajor::view(const NsaParams& p, int64_t n_sel_units) {
  Workspace sizing = Workspace::sizing();
  carve_sel_block_major(p, budget_, n_sel_units, sizing);
  if (static_cast<int64_t>(sizing.used()) > mem_.size()) mem_.resize(sizing.used());
  Workspace ws(mem_.get(), mem_.bytes());
  return carve_sel_block_major(p, budget_, n_sel_units, ws);
}

void run_sel_block_major_forward(const NsaParams& p, const SelBlockMajorView& v,
                                 cudaStream_t stream, bool combine, cudaEvent_t merge_after) {
  if (p.T == 0) return;
  NSA_CHECK(p.l_sel <= kSelBlockMajorMaxLsel, "selected branch (block-major): l_sel ", p.l_sel,
            " > ", kSelBlockMajorMaxLsel);
  const int64_t rows = v.rows;
  const int ne = entries_per_cta(p.hpg);
  dispatch_head_dims(p.dk, p.dv, [&](auto DK, auto DV) {
    const auto kernel = sel_block_major_kernel<DK(), DV()>;
    const size_t smem = smem_bytes<DK(), DV()>(p, ne);
    set_kernel_smem(kernel, smem);
    for (int64_t r0 = 0; r0 < p.T; r0 += rows) {
      const int64_t nr = std::min(rows, p.T - r0);
      const int64_t n = sort_chunk(p, v, r0, nr, stream);
      const ChunkArgs a{v.keys_out, n, r0, ne, v.part, v.part_lse};
      kernel<<<static_cast<unsigned>((n + ne - 1) / ne), kThreads, smem, stream>>>(p, a);
      NSA_CUDA_LAUNCH_CHECK();
      NSA_CHECK(nr * p.H < (int64_t{1} << 31), "selected branch (block-major): ", nr * p.H,
                " (row, head) pairs in a chunk do not fit the merge's 32-bit indices");
      const unsigned merge_ctas = static_cast<unsigned>((nr * p.H + 7) / 8);  // a warp per pair
      if (merge_after && r0 == 0) NSA_CUDA_CHECK(cudaStreamWaitEvent(stream, merge_after, 0));
      merge_forward_kernel<DV()><<<merge_ctas, 256, 0, stream>>>(p, r0, static_cast<int>(nr),
                                                                 v.part, v.part_lse, combine);
      NSA_CUDA_LAUNCH_CHECK();
    }
  });
}

bool sel_block_major_writes_bf16(const NsaParams& p, const SelBlockMajorView& v, bool accumulate) {
  return !accumulate && v.rows >= p.T && p.d_k_bf16[1] && p.d_v_bf16[1];
}

void run_sel_block_major_backward(const NsaParams& p, const SelBlockMajorView& v,
                                  const RowTile* units, int64_t n_units, bool accumulate,
                                  cudaStream_t stream, cudaEvent_t merge_after,
                                  cudaEvent_t dkdv_done) {
  if (p.T == 0) return;
  NSA_CHECK(n_units <= v.n_units, "selected branch (block-major): ", n_units,
            " units, the scratch was carved for ", v.n_units);
  // Rows no item writes are zeros: in the bf16 gradient where the one pass writes that, else in
  // the fp32 sums (which later passes then add to).
  const bool bf16_out = sel_block_major_writes_bf16(p, v, accumulate);
  const int64_t nk = p.T * p.G * p.dk, nv = p.T * p.G * p.dv;
  if (bf16_out) {
    NSA_CUDA_CHECK(cudaMemsetAsync(p.d_k_bf16[1], 0, nk * sizeof(bf16), stream));
    NSA_CUDA_CHECK(cudaMemsetAsync(p.d_v_bf16[1], 0, nv * sizeof(bf16), stream));
  } else if (!accumulate) {
    NSA_CUDA_CHECK(cudaMemsetAsync(p.d_k[1], 0, nk * sizeof(float), stream));
    NSA_CUDA_CHECK(cudaMemsetAsync(p.d_v[1], 0, nv * sizeof(float), stream));
  }
  const SelItemScratch scratch{v.counts,          v.item_end,  v.scan_temp,
                               v.scan_temp_bytes, v.item_part, v.items};
  dispatch_head_dims(p.dk, p.dv, [&](auto DK, auto) {
    for (int64_t r0 = 0; r0 < p.T; r0 += v.rows) {
      const int64_t nr = std::min(v.rows, p.T - r0);
      SelGradOut out;
      out.accumulate = accumulate || r0 > 0;
      if (bf16_out) out.k16 = p.d_k_bf16[1], out.v16 = p.d_v_bf16[1];
      launch_sel_dkdv_dq(p, units, n_units, SelDqPass{r0, r0 + nr, v.part}, out, scratch, stream);
      if (dkdv_done && r0 + nr >= p.T) NSA_CUDA_CHECK(cudaEventRecord(dkdv_done, stream));
      NSA_CHECK(nr * p.H < (int64_t{1} << 31), "selected branch (block-major): ", nr * p.H,
                " (row, head) pairs in a chunk do not fit the merge's 32-bit indices");
      const unsigned merge_ctas = static_cast<unsigned>((nr * p.H + 7) / 8);  // a warp per pair
      if (merge_after && r0 == 0) NSA_CUDA_CHECK(cudaStreamWaitEvent(stream, merge_after, 0));
      merge_dq_kernel<DK()><<<merge_ctas, 256, 0, stream>>>(p, r0, static_cast<int>(nr), v.part);
      NSA_CUDA_LAUNCH_CHECK();
    }
  });
}

}  // namespace nsa::cuda
