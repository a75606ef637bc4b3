// Merging the decode parts' partial softmax results (decode_params.cuh): (max m, sum of exp l,
// unnormalised o) per part and head. The combine merges a range of slots: for dense decoding into
// o, for NSA into one partial per branch (the top-n kernel's pre-merge), which the picks kernel's
// cluster gates into o with its own parts' partials (push_partial, gate_branches).
// Every sum runs in a fixed order (parts ascending, fixed thread roles), with no atomics, so the
// result is the same bits whichever CTA runs it and whatever else is in the batch. Partials are
// read with ld.global.cg (L2): other CTAs of the kernel (or of the kernels before) wrote them.
#pragma once

#include <cfloat>

#include "common/dependent_launch.cuh"
#include "common/fast_exp.cuh"
#include "common/mma.cuh"
#include "decode_params.cuh"

namespace nsa::cuda::decode {

// Folds a part's (max, sum of exp) into a running pair: the merged max and the sum rescaled to it.
// The same two pairs give the same result in either order (the kept max's side is exact), so
// the lanes of a butterfly agree bit for bit. Empty parts (sum 0) are skipped.
__device__ __forceinline__ void fold_stats(float& mx, float& sum, float m2, float s2) {
  if (!(s2 > 0.0f)) return;
  if (m2 > mx) {
    sum = sum * fast_exp(mx - m2) + s2;
    mx = m2;
  } else {
    sum += s2 * fast_exp(m2 - mx);
  }
}

__device__ __forceinline__ float2 load_ml(const DecodeDims& m, const float* part_ml, int bg,
                                          int slot, int h) {
  return __ldcg(reinterpret_cast<const float2*>(part_ml + 2 * (part_index(m, bg, slot) + h)));
}

// Folds the (max, sum) of slots first + start, first + start + stride, … < end of head h.
__device__ __forceinline__ void fold_slots(const DecodeDims& m, const float* part_ml, int bg, int h,
                                           int first, int end, int start, int stride, float& mx,
                                           float& sum) {
#pragma unroll 4
  for (int p = first + start; p < end; p += stride) {
    const float2 ml = load_ml(m, part_ml, bg, p, h);
    fold_stats(mx, sum, ml.x, ml.y);
  }
}

// The (max, sum) pairs of the warp's 32 lanes merged, in every lane: the max first (a butterfly
// of fmaxf), then each lane's sum rescaled to it (an empty lane's is 0) and summed by a butterfly,
// whose every level adds the same two values in either order – so all lanes get the same bits. No
// branches and one exponential: at batch 1 the chain's length is its latency (a butterfly of
// pairwise folds took five exponentials and branches). Every lane of the warp must call it.
__device__ __forceinline__ void warp_fold(float& mx, float& sum) {
  float top = mx;
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) top = fmaxf(top, __shfl_xor_sync(0xffffffffu, top, off));
  float total = sum > 0.0f ? sum * fast_exp(mx - top) : 0.0f;
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) total += __shfl_xor_sync(0xffffffffu, total, off);
  mx = top;
  sum = total;
}

// A running merge of parts for one output float4 of one head and branch: the max m, the sum of
// exp l and the output acc, both rescaled to m. Starts at (−FLT_MAX, 0, 0); empty parts (sum 0,
// their o junk: loaded, never multiplied) are skipped.
struct Running {
  float4 acc;
  float m, l;
};

__device__ __forceinline__ Running running_start() {
  return Running{make_float4(0, 0, 0, 0), -FLT_MAX, 0.0f};
}

// Folds a part (or another running merge) (m2, l2, o2) into s: the kept max's side is exact.
__device__ __forceinline__ void fold_running(Running& s, float m2, float l2, float4 o2) {
  if (!(l2 > 0.0f)) return;
  float a = 1.0f, c = 1.0f;  // s's scale, the part's scale
  if (m2 > s.m) {
    a = fast_exp(s.m - m2);
    s.m = m2;
  } else {
    c = fast_exp(m2 - s.m);
  }
  s.l = s.l * a + l2 * c;
  s.acc.x = s.acc.x * a + o2.x * c;
  s.acc.y = s.acc.y * a + o2.y * c;
  s.acc.z = s.acc.z * a + o2.z * c;
  s.acc.w = s.acc.w * a + o2.w * c;
}

// Folds a batch of slots (live: sum > 0) into s at once: the batch's max first and one rescale of
// s, then each slot's weight exp(m_u − max) – independent exponentials and multiply-adds, not a
// chain of dependent folds (at batch 1 every dependent instruction costs its whole latency). Slots
// ascending: a fixed order.
template <int K>
__device__ __forceinline__ void fold_batch(Running& s, const bool (&in)[K], const float2 (&ml)[K],
                                           const float4 (&ov)[K]) {
  float mx = s.m;
  bool any = false;
#pragma unroll
  for (int u = 0; u < K; ++u) {
    const bool live = in[u] && ml[u].y > 0.0f;
    mx = live ? fmaxf(mx, ml[u].x) : mx;
    any |= live;
  }
  if (!any) return;
  if (mx > s.m) {  // s empty: its sum and output are 0, any scale keeps them 0
    const float a = fast_exp(s.m - mx);
    s.l *= a, s.acc.x *= a, s.acc.y *= a, s.acc.z *= a, s.acc.w *= a;
    s.m = mx;
  }
#pragma unroll
  for (int u = 0; u < K; ++u) {
    const bool live = in[u] && ml[u].y > 0.0f;
    const float w =
        live ? fast_exp(ml[u].x - mx) : 0.0f;  // junk o of a dead slot: never multiplied
    s.l = fmaf(w, live ? ml[u].y : 0.0f, s.l);
    s.acc.x = fmaf(w, live ? ov[u].x : 0.0f, s.acc.x);
    s.acc.y = fmaf(w, live ? ov[u].y : 0.0f, s.acc.y);
    s.acc.z = fmaf(w, live ? ov[u].z : 0.0f, s.acc.z);
    s.acc.w = fmaf(w, live ? ov[u].w : 0.0f, s.acc.w);
  }
}

// One merge of a combine: slots [lo, hi) of one head into slot `out` (NSA's pre-merge) or into o
// (dense decoding), by threads [t0, t0 + threads) of the CTA.
struct MergeRange {
  int lo, hi, out, t0, threads;
};

// The merges of `ranges` for head h of group g of sequence b, side by side in one CTA: each range
// its (M, L, A), the running merge (max, sum of exp, output). kToPartial (NSA's pre-merge of the
// branches): written as a partial to slot `out`. Otherwise (dense decoding): o [B, H, dv] (bf16) =
// A / L. Every thread of a range takes one output float4 (an item; dv/4 ≤ 64 of them, no more than
// a range's threads) and a share of the range's slots – split s taking lo + s, lo + s + splits, …
// (at most one split a slot) – and loads a batch (8 slots; 4 for kToPartial, in the top-n kernel,
// whose threads hold 64 registers) before it folds any (fold_batch), so a share of up to a batch
// costs one round trip. The splits' merges then meet in shared memory, folded pairwise as a tree
// (split s takes s + half, half = …, 2, 1) whose levels all ranges pass together (one barrier a
// level; a range with fewer splits starts lower). A fixed order throughout: the same bits
// whichever CTA runs it. Every thread of the CTA (kThreads of them) calls it.
template <bool kToPartial, int kThreads, int kRanges>
__device__ void combine(const DecodeDims& m, float* part_ml, float* part_o, int b, int g, int h,
                        const MergeRange (&ranges)[kRanges], bf16* o) {
  constexpr int kBatch = kToPartial ? 4 : 8;
  __shared__ float4 split_acc[kThreads];
  __shared__ float2 split_ml[kThreads];
  const int bg = b * m.G + g, items = m.dv / 4, tid = threadIdx.x;
  const auto splits_of = [&](const MergeRange& r) {
    return max(1, min(r.threads / items, r.hi - r.lo));
  };
  // This thread's range (selected without indexing, so that it stays in registers), and the most
  // splits of any range: the tree's height.
  MergeRange rg{0, 0, 0, 0, 0};
  bool mine = false;
  int most = 1;
#pragma unroll
  for (int k = 0; k < kRanges; ++k) {
    const bool in = tid >= ranges[k].t0 && tid < ranges[k].t0 + ranges[k].threads;
    rg = in ? ranges[k] : rg;
    mine |= in;
    most = max(most, splits_of(ranges[k]));
  }
  const int splits = splits_of(rg), local = tid - rg.t0;
  const int item = local % items, split = local / items, e4 = 4 * item;
  const bool active = mine && split < splits;
  Running st = running_start();
  if (active) {
    const int total = rg.hi - rg.lo;
    for (int f0 = split; f0 < total; f0 += splits * kBatch) {
      float2 ml[kBatch];
      float4 ov[kBatch];
      bool in[kBatch];
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        const int f = f0 + u * splits;
        in[u] = f < total;
        if (in[u]) {
          ml[u] = load_ml(m, part_ml, bg, rg.lo + f, h);
          ov[u] = __ldcg(reinterpret_cast<const float4*>(
              part_o + (part_index(m, bg, rg.lo + f) + h) * m.dv + e4));
        }
      }
      fold_batch(st, in, ml, ov);
    }
    split_acc[tid] = st.acc;
    split_ml[tid] = make_float2(st.m, st.l);
  }
  // The splits meet as a tree: at each level the upper half folds into the lower (split s takes
  // s + half), so the chain is log2(splits) folds long, not splits − 1.
  int half = 1;
  while (2 * half < most) half *= 2;
  for (; half >= 1; half /= 2) {
    __syncthreads();  // the level's upper half is written
    if (active && split < half && split + half < splits) {
      const int from = rg.t0 + (split + half) * items + item;
      const float2 ml = split_ml[from];
      fold_running(st, ml.x, ml.y, split_acc[from]);
      if (split >= half / 2 && half > 1) {  // this split is read at the next level
        split_acc[tid] = st.acc;
        split_ml[tid] = make_float2(st.m, st.l);
      }
    }
  }
  if (!active || split != 0) return;
  if constexpr (kToPartial) {
    const int64_t pi = part_index(m, bg, rg.out) + h;
    *reinterpret_cast<float4*>(part_o + pi * m.dv + e4) = st.acc;
    if (e4 == 0) *reinterpret_cast<float2*>(part_ml + 2 * pi) = make_float2(st.m, st.l);
  } else {
    const float scale = st.l > 0.0f ? 1.0f / st.l : 0.0f;
    const int64_t gi = static_cast<int64_t>(bg) * m.hpg + h;
    __nv_bfloat162* dst = reinterpret_cast<__nv_bfloat162*>(o + gi * m.dv + e4);
    dst[0] = __floats2bfloat162_rn(scale * st.acc.x, scale * st.acc.y);
    dst[1] = __floats2bfloat162_rn(scale * st.acc.z, scale * st.acc.w);
  }
}

// A partial of a picks CTA in its shared memory: per head h < hpg the max and sum of exp at
// ml[2h], ml[2h + 1], and the unnormalised output o[h·dv + e] (tile_attend's layout).
struct SmemPartial {
  float *ml, *o;
};

__host__ __device__ constexpr size_t smem_partial_bytes(int hpg, int dv) {
  return round16(static_cast<size_t>(hpg) * (2 + dv) * sizeof(float));
}

__device__ __forceinline__ SmemPartial carve_partial(unsigned char* base, const DecodeDims& m) {
  float* f = reinterpret_cast<float*>(base);
  return SmemPartial{f, f + 2 * m.hpg};
}

// Folds `extra` into `own` head by head (a CTA's second and later parts): the pair's max kept, each
// side rescaled to it; an empty side (sum 0, its o junk) is never multiplied. Every thread of the
// CTA calls it (two barriers).
__device__ void fold_partial(const DecodeDims& m, const SmemPartial& own,
                             const SmemPartial& extra) {
  for (int i = threadIdx.x; i < m.hpg * m.dv; i += blockDim.x) {
    const int h = i / m.dv;
    const float2 a = reinterpret_cast<const float2*>(own.ml)[h];
    const float2 x = reinterpret_cast<const float2*>(extra.ml)[h];
    if (!(x.y > 0.0f)) continue;
    if (!(a.y > 0.0f)) {
      own.o[i] = extra.o[i];
      continue;
    }
    const float mx = fmaxf(a.x, x.x);
    own.o[i] = own.o[i] * fast_exp(a.x - mx) + extra.o[i] * fast_exp(x.x - mx);
  }
  __syncthreads();  // every output read own's old max
  for (int h = threadIdx.x; h < m.hpg; h += blockDim.x) {
    float2& a = reinterpret_cast<float2*>(own.ml)[h];
    const float2 x = reinterpret_cast<const float2*>(extra.ml)[h];
    if (!(x.y > 0.0f)) continue;
    if (!(a.y > 0.0f)) {
      a = x;
      continue;
    }
    const float mx = fmaxf(a.x, x.x);
    a = make_float2(mx, a.y * fast_exp(a.x - mx) + x.y * fast_exp(x.x - mx));
  }
  __syncthreads();
}

// What the picks CTAs' final merge reads for one output element (head h, element e): each
// branch's pre-merged partial (slot slot_pre + r, the top-n kernel's) and its gate.
struct PreMerged {
  float2 ml[kNumBranches];
  float o[kNumBranches], gate[kNumBranches];
};

// The pre-merged partials and the gates of the heads a picks CTA gates, in its shared memory:
// head hl's branch r at o[(hl·3 + r)·dv], ml[hl·3 + r], gate[hl·3 + r]. The partials are copied
// (cp.async) with the candidate lists, right after the wait, so that the final merge finds them
// there instead of waiting for L2 at the end of the kernel's chain; the gates, written kernels
// earlier, are stored before the wait.
struct PreMergedTile {
  float* o;
  float2* ml;
  float* gate;
};

__host__ __device__ constexpr size_t premerged_tile_bytes(int heads, int dv) {
  return round16(static_cast<size_t>(heads) * kNumBranches * (dv + 2 + 1) * sizeof(float));
}

__device__ __forceinline__ PreMergedTile carve_premerged(unsigned char* base, int heads,
                                                         const DecodeDims& m) {
  float* f = reinterpret_cast<float*>(base);  // o first: 16-byte aligned rows
  const int n = heads * kNumBranches;
  return PreMergedTile{f, reinterpret_cast<float2*>(f + n * m.dv), f + n * (m.dv + 2)};
}

// Before the wait: the gates of heads h0 .. h0 + nh − 1 (bf16 [B, H] per branch) as floats.
__device__ __forceinline__ void store_gates(const DecodeDims& m,
                                            const bf16* const (&gate)[kNumBranches], int bg, int h0,
                                            int nh, const PreMergedTile& pt) {
  for (int i = threadIdx.x; i < nh * kNumBranches; i += blockDim.x) {
    const int hl = i / kNumBranches, r = i - hl * kNumBranches;
    pt.gate[i] = __bfloat162float(gate[r][static_cast<int64_t>(bg) * m.hpg + h0 + hl]);
  }
}

// After the wait: starts copying the pre-merged partials of heads h0 .. h0 + nh − 1 (no commit).
__device__ __forceinline__ void issue_premerged(const DecodeDims& m, const float* part_ml,
                                                const float* part_o, int bg, int h0, int nh,
                                                const PreMergedTile& pt) {
  const int per = m.dv / 4 + 1;  // the output's 16-byte pieces, then (max, sum)
  for (int i = threadIdx.x; i < nh * kNumBranches * per; i += blockDim.x) {
    const int k = i / per, j = i - k * per, hl = k / kNumBranches, r = k - hl * kNumBranches;
    const int64_t pi = part_index(m, bg, m.slot_pre + r) + h0 + hl;
    if (j < per - 1) {
      cp_async<16>(pt.o + k * m.dv + 4 * j, part_o + pi * m.dv + 4 * j);
    } else {
      cp_async<8>(pt.ml + k, part_ml + 2 * pi);
    }
  }
}

__device__ __forceinline__ PreMerged premerged_at(const DecodeDims& m, const PreMergedTile& pt,
                                                  int hl, int e) {
  PreMerged pm;
#pragma unroll
  for (int r = 0; r < kNumBranches; ++r) {
    const int k = hl * kNumBranches + r;
    pm.ml[r] = pt.ml[k];
    pm.o[r] = pt.o[k * m.dv + e];
    pm.gate[r] = pt.gate[k];
  }
  return pm;
}

// A picks CTA's inbox: the partials of the heads it gates (hl < heads, heads = ⌈hpg / cluster⌉),
// one from every CTA k of the cluster – o at o[(k·heads + hl)·dv], (max, sum) at ml[2(k·heads +
// hl)] – pushed there by push_partial. cluster · heads ≤ hpg + kPicksCluster − 1 whatever the
// cluster's size, so one size serves every cluster.
struct Inbox {
  float *o, *ml;
};

__host__ __device__ constexpr size_t inbox_bytes(int hpg, int dv) {  // a multiple of 16
  return round16(static_cast<size_t>(hpg + kPicksCluster - 1) * (dv + 2) * sizeof(float));
}

__device__ __forceinline__ Inbox carve_inbox(unsigned char* base, const DecodeDims& m) {
  float* f = reinterpret_cast<float*>(base);  // o first: its float4 rows stay 16-byte aligned
  return Inbox{f, f + (m.hpg + kPicksCluster - 1) * m.dv};
}

// Sends this CTA's partial (`own`, complete) of every head h to the inbox of the CTA that gates h
// (rank h / heads), slot `rank`, completing on that CTA's `received` barrier: asynchronous stores
// into distributed shared memory, no fence and no barrier – the receiver waits for its bytes
// (common/dependent_launch.cuh). The CTA's own heads take plain stores, which a CTA barrier
// publishes (st.async into its own CTA is invalid in a cluster of one). An empty partial's junk o
// is sent too; its sum 0 says so.
__device__ __forceinline__ void push_partial(const DecodeDims& m, const SmemPartial& own,
                                             const Inbox& inbox, uint64_t* received, int rank,
                                             int heads) {
  // v (a float4 of o or a float2 (max, sum)) to dst in the inbox of CTA `to`.
  const auto send = [&](float* dst, int to, auto v) {
    if (to == rank) {  // its own heads: plain stores (a barrier follows)
      *reinterpret_cast<decltype(v)*>(dst) = v;
    } else {
      st_async_cluster(cluster_address(dst, to), v, cluster_address(received, to));
    }
  };
  const int q = m.dv / 4;
  for (int i = threadIdx.x; i < m.hpg * q; i += blockDim.x) {
    const int h = i / q, e4 = i - h * q, to = h / heads, hl = h - to * heads;
    send(inbox.o + (rank * heads + hl) * m.dv + 4 * e4, to,
         reinterpret_cast<const float4*>(own.o + h * m.dv)[e4]);
  }
  for (int h = threadIdx.x; h < m.hpg; h += blockDim.x) {
    const int to = h / heads, hl = h - to * heads;
    send(inbox.ml + 2 * (rank * heads + hl), to, reinterpret_cast<const float2*>(own.ml)[h]);
  }
}

// Once the inbox is full: output element e of local head hl, o = Σ_r gate_r · A_r / L_r over the
// branches in order, (M_r, L_r, A_r) branch r's merge – the pre-merged partial, and for the
// selected branch that folded with the partial of every CTA of the cluster (the inbox's slot k,
// k ascending). The max first, then independent weights: no chain of folds.
__device__ __forceinline__ float gate_branches(const DecodeDims& m, const PreMerged& pm,
                                               const Inbox& inbox, int cluster, int heads, int hl,
                                               int e) {
  float2 ml[kPicksCluster];
  float ov[kPicksCluster];
#pragma unroll
  for (int k = 0; k < kPicksCluster; ++k) {
    ml[k] = make_float2(-FLT_MAX, 0.0f);
    ov[k] = 0.0f;
    if (k < cluster) {
      ml[k] = reinterpret_cast<const float2*>(inbox.ml)[k * heads + hl];
      ov[k] = inbox.o[(k * heads + hl) * m.dv + e];
    }
  }
  const float2 pre = pm.ml[kSel];
  float mx = pre.y > 0.0f ? pre.x : -FLT_MAX;
#pragma unroll
  for (int k = 0; k < kPicksCluster; ++k) mx = ml[k].y > 0.0f ? fmaxf(mx, ml[k].x) : mx;
  float l = 0.0f, a = 0.0f;
  if (pre.y > 0.0f) {
    const float w = fast_exp(pre.x - mx);
    l = w * pre.y, a = w * pm.o[kSel];
  }
#pragma unroll
  for (int k = 0; k < kPicksCluster; ++k) {
    const bool live = ml[k].y > 0.0f;  // junk o of an empty partial: never multiplied
    const float w = live ? fast_exp(ml[k].x - mx) : 0.0f;
    l = fmaf(w, live ? ml[k].y : 0.0f, l);
    a = fmaf(w, live ? ov[k] : 0.0f, a);
  }
  float out = 0.0f;
#pragma unroll
  for (int r = 0; r < kNumBranches; ++r) {
    const float lr = r == kSel ? l : pm.ml[r].y, ar = r == kSel ? a : pm.o[r];
    out += lr > 0.0f ? pm.gate[r] / lr * ar : 0.0f;
  }
  return out;
}

}  // namespace nsa::cuda::decode
