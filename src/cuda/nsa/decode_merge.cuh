// Merging the decode parts' partial softmax results (decode_params.cuh): (max m, sum of exp l,
// unnormalised o) per part and head. The combine merges each branch's slots: for dense decoding
// into o, for NSA into one partial per branch (the top-n kernel's pre-merge, which the picks
// kernel's cluster gates into o with its own parts).
// Every sum runs in a fixed order (parts ascending, fixed thread roles), with no atomics, so the
// result is the same bits whichever CTA runs it and whatever else is in the batch. Partials are
// read with ld.global.cg (L2): other CTAs of the kernel (or of the kernels before) wrote them.
#pragma once

#include <cfloat>

#include "common/dependent_launch.cuh"
#include "decode_params.cuh"

namespace nsa::cuda::decode {

// Folds a part's (max, sum of exp) into a running pair: the merged max and the sum rescaled to it.
// The same two pairs give the same result in either order (the kept max's side is exact), so
// the lanes of a butterfly agree bit for bit. Empty parts (sum 0) are skipped.
__device__ __forceinline__ void fold_stats(float& mx, float& sum, float m2, float s2) {
  if (!(s2 > 0.0f)) return;
  if (m2 > mx) {
    sum = sum * __expf(mx - m2) + s2;
    mx = m2;
  } else {
    sum += s2 * __expf(m2 - mx);
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

// Butterfly over `width` (a power of two ≤ 32) aligned lanes: each gets the group's pair. Every
// lane of the warp must call it.
__device__ __forceinline__ void lanes_fold(float& mx, float& sum, int width) {
  for (int off = width / 2; off > 0; off >>= 1) {
    const float m2 = __shfl_xor_sync(0xffffffffu, mx, off);
    const float s2 = __shfl_xor_sync(0xffffffffu, sum, off);
    fold_stats(mx, sum, m2, s2);
  }
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
    a = __expf(s.m - m2);
    s.m = m2;
  } else {
    c = __expf(m2 - s.m);
  }
  s.l = s.l * a + l2 * c;
  s.acc.x = s.acc.x * a + o2.x * c;
  s.acc.y = s.acc.y * a + o2.y * c;
  s.acc.z = s.acc.z * a + o2.z * c;
  s.acc.w = s.acc.w * a + o2.w * c;
}

// The branches a combine merges: slots [lo[r], hi[r]) of branch r; a branch with lo = hi (dense
// decoding's 1 and 2) adds nothing.
struct Branches {
  int lo[kNumBranches], hi[kNumBranches];
};

// Folds the batch's slots u of branch r (rr[u] == r, live: sum > 0) into s at once: the batch's
// max first and one rescale of s, then each slot's weight exp(m_u − max) – independent
// exponentials and multiply-adds, not a chain of dependent folds (at batch 1 every dependent
// instruction costs its whole latency). Slots ascending: a fixed order.
template <int K>
__device__ __forceinline__ void fold_batch(Running& s, int r, const int (&rr)[K],
                                           const float2 (&ml)[K], const float4 (&ov)[K]) {
  float mx = s.m;
  bool any = false;
#pragma unroll
  for (int u = 0; u < K; ++u) {
    const bool live = rr[u] == r && ml[u].y > 0.0f;
    mx = live ? fmaxf(mx, ml[u].x) : mx;
    any |= live;
  }
  if (!any) return;
  if (mx > s.m) {  // s empty: its sum and output are 0, any scale keeps them 0
    const float a = __expf(s.m - mx);
    s.l *= a, s.acc.x *= a, s.acc.y *= a, s.acc.z *= a, s.acc.w *= a;
    s.m = mx;
  }
#pragma unroll
  for (int u = 0; u < K; ++u) {
    const bool live = rr[u] == r && ml[u].y > 0.0f;
    const float w = live ? __expf(ml[u].x - mx) : 0.0f;  // junk o of a dead slot: never multiplied
    s.l = fmaf(w, live ? ml[u].y : 0.0f, s.l);
    s.acc.x = fmaf(w, live ? ov[u].x : 0.0f, s.acc.x);
    s.acc.y = fmaf(w, live ? ov[u].y : 0.0f, s.acc.y);
    s.acc.z = fmaf(w, live ? ov[u].z : 0.0f, s.acc.z);
    s.acc.w = fmaf(w, live ? ov[u].w : 0.0f, s.acc.w);
  }
}

// Heads h0 .. h0 + nh − 1 of group g of sequence b, each branch's slots merged: (M_r, L_r, A_r),
// the running merge of branch r (max, sum of exp, output). kDense (dense decoding: branch 0 only,
// tens of slots per split): o [B, H, dv] (bf16) = A_0 / L_0. Otherwise (NSA's pre-merge: a few
// slots per split from three branches) each branch's merge goes to slot slot_pre + r as a partial.
// Every thread takes one output float4 (an item) and a share of all the branches' slots at once –
// the slots in a flat order (branches in order, slots ascending), split s taking s, s + splits, …
// – and loads a batch of them before it folds any, so a share of up to a batch costs one round
// trip. kDense: batches of 8, each folded at once (fold_batch). Otherwise batches of 4 folded slot
// by slot – fewer instructions and less code for two or three live slots a split (docs/perf.md,
// fifteenth session: the NSA step 6 % slower with both ways compiled into one function). The
// splits' merges then meet in shared memory, folded pairwise as a tree (split s takes s + half,
// half = …, 2, 1). A fixed order throughout: the same bits whichever CTA runs it. Every thread of
// the CTA (kThreads of them) calls it.
template <bool kDense, int kThreads>
__device__ void combine(const DecodeDims& m, float* part_ml, float* part_o, int b, int g, int h0,
                        int nh, const Branches& br, bf16* o) {
  constexpr int kBatch = kDense ? 8 : 4, kBranches = kDense ? 1 : kNumBranches;
  __shared__ float4 split_acc[kBranches][kThreads];
  __shared__ float2 split_ml[kBranches][kThreads];
  const int bg = b * m.G + g;
  const int per_head = m.dv / 4, items = nh * per_head;
  // The flat slot order: branch r's slots are [start_r, start_r + hi_r − lo_r).
  const int start1 = br.hi[0] - br.lo[0], start2 = start1 + br.hi[1] - br.lo[1];
  const int total = start2 + br.hi[2] - br.lo[2];
  const int splits = max(1, static_cast<int>(blockDim.x) / items);
  const auto slot_of = [&](int f, int r) {
    return r == 0 ? br.lo[0] + f : r == 1 ? br.lo[1] + f - start1 : br.lo[2] + f - start2;
  };
  // Branch r's merge of slots first, first + stride, … for head hh, elements e4 .. e4 + 3.
  const auto run = [&](int hh, int e4, int first, int stride, Running(&st)[kBranches]) {
#pragma unroll
    for (int r = 0; r < kBranches; ++r) st[r] = running_start();
    for (int f0 = first; f0 < total; f0 += stride * kBatch) {
      float2 ml[kBatch];
      float4 ov[kBatch];
      int rr[kBatch];
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        const int f = f0 + u * stride;
        rr[u] = f >= total ? -1 : f < start1 ? 0 : f < start2 ? 1 : 2;
        if (f < total) {
          const int64_t pi = part_index(m, bg, slot_of(f, rr[u])) + h0 + hh;
          ml[u] = __ldcg(reinterpret_cast<const float2*>(part_ml + 2 * pi));
          ov[u] = __ldcg(reinterpret_cast<const float4*>(part_o + pi * m.dv + e4));
        }
      }
      if constexpr (kDense) {
        fold_batch(st[0], 0, rr, ml, ov);
      } else {
#pragma unroll
        for (int u = 0; u < kBatch; ++u) {  // the slot's branch, picked by selects: one fold
          if (rr[u] < 0) continue;
          Running cur = rr[u] == 0 ? st[0] : rr[u] == 1 ? st[1] : st[2];
          fold_running(cur, ml[u].x, ml[u].y, ov[u]);
          st[0] = rr[u] == 0 ? cur : st[0];
          st[1] = rr[u] == 1 ? cur : st[1];
          st[2] = rr[u] == 2 ? cur : st[2];
        }
      }
    }
  };
  const auto store = [&](int hh, int e4, const Running(&st)[kBranches]) {
    if constexpr (kDense) {
      const float scale = st[0].l > 0.0f ? 1.0f / st[0].l : 0.0f;
      const int64_t gi = static_cast<int64_t>(b) * m.G * m.hpg + g * m.hpg + h0 + hh;
      __nv_bfloat162* dst = reinterpret_cast<__nv_bfloat162*>(o + gi * m.dv + e4);
      dst[0] = __floats2bfloat162_rn(scale * st[0].acc.x, scale * st[0].acc.y);
      dst[1] = __floats2bfloat162_rn(scale * st[0].acc.z, scale * st[0].acc.w);
    } else {
#pragma unroll
      for (int r = 0; r < kBranches; ++r) {
        const int64_t pi = part_index(m, bg, m.slot_pre + r) + h0 + hh;
        *reinterpret_cast<float4*>(part_o + pi * m.dv + e4) = st[r].acc;
        if (e4 == 0) *reinterpret_cast<float2*>(part_ml + 2 * pi) = make_float2(st[r].m, st[r].l);
      }
    }
  };
  Running st[kBranches];
  if (splits == 1) {  // a thread per item (or several), all the slots each
    for (int item = threadIdx.x; item < items; item += blockDim.x) {
      const int hh = item / per_head, e4 = 4 * (item % per_head);
      run(hh, e4, 0, 1, st);
      store(hh, e4, st);
    }
    return;
  }
  const int item = threadIdx.x % items, split = threadIdx.x / items;
  const int hh = item / per_head, e4 = 4 * (item % per_head);
  if (split < splits) {
    run(hh, e4, split, splits, st);
#pragma unroll
    for (int r = 0; r < kBranches; ++r) {
      split_acc[r][threadIdx.x] = st[r].acc;
      split_ml[r][threadIdx.x] = make_float2(st[r].m, st[r].l);
    }
  }
  // The splits meet as a tree: at each level the upper half folds into the lower (split s takes
  // s + half), so the chain is log2(splits) folds long, not splits − 1.
  int half = 1;
  while (2 * half < splits) half *= 2;
  for (; half >= 1; half /= 2) {
    __syncthreads();  // the level's upper half is written
    if (split < half && split + half < splits) {
      const int from = (split + half) * items + item;
#pragma unroll
      for (int r = 0; r < kBranches; ++r) {
        const float2 ml = split_ml[r][from];
        fold_running(st[r], ml.x, ml.y, split_acc[r][from]);
      }
      if (split >= half / 2 && half > 1) {  // this split is read at the next level
#pragma unroll
        for (int r = 0; r < kBranches; ++r) {
          split_acc[r][threadIdx.x] = st[r].acc;
          split_ml[r][threadIdx.x] = make_float2(st[r].m, st[r].l);
        }
      }
    }
  }
  if (split == 0) store(hh, e4, st);
}

// A partial of a picks CTA in its shared memory: per head h < hpg the max and sum of exp at
// ml[2h], ml[2h + 1], and the unnormalised output o[h·dv + e] (tile_attend's layout).
struct SmemPartial {
  float *ml, *o;
};

__host__ __device__ constexpr size_t smem_partial_bytes(int hpg, int dv) {
  return (static_cast<size_t>(hpg) * (2 + dv) * sizeof(float) + 15) / 16 * 16;
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
    own.o[i] = own.o[i] * __expf(a.x - mx) + extra.o[i] * __expf(x.x - mx);
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
    a = make_float2(mx, a.y * __expf(a.x - mx) + x.y * __expf(x.x - mx));
  }
  __syncthreads();
}

// What the picks CTAs' final merge reads from global memory for one output element (head h, element
// e): each branch's pre-merged partial (slot slot_pre + r, the top-n kernel's) and its gate.
struct PreMerged {
  float2 ml[kNumBranches];
  float o[kNumBranches], gate[kNumBranches];
};

__device__ __forceinline__ PreMerged load_premerged(const DecodeDims& m, const float* part_ml,
                                                    const float* part_o,
                                                    const bf16* const (&gate)[kNumBranches], int b,
                                                    int g, int h, int e) {
  PreMerged pm;
  const int bg = b * m.G + g;
  const int64_t gi = (static_cast<int64_t>(b) * m.G + g) * m.hpg + h;
#pragma unroll
  for (int r = 0; r < kNumBranches; ++r) {
    const int64_t pi = part_index(m, bg, m.slot_pre + r) + h;
    pm.ml[r] = __ldcg(reinterpret_cast<const float2*>(part_ml + 2 * pi));
    pm.o[r] = __ldcg(part_o + pi * m.dv + e);
    pm.gate[r] = __bfloat162float(gate[r][gi]);
  }
  return pm;
}

// After the picks cluster's barrier: output element e of head h, o = Σ_r gate_r · A_r / L_r over
// the branches in order, (M_r, L_r, A_r) branch r's merge – the pre-merged partial, and for the
// selected branch that folded with the partial of every CTA of the cluster (`own`'s place in CTA
// k's shared memory, k ascending). The max first, then independent weights: one round trip of
// distributed-shared-memory loads, no chain of folds, no barrier.
__device__ __forceinline__ float gate_branches(const DecodeDims& m, const PreMerged& pm,
                                               const SmemPartial& own, int cluster, int h, int e) {
  float2 ml[kPicksCluster];
  float ov[kPicksCluster];
#pragma unroll
  for (int k = 0; k < kPicksCluster; ++k) {
    ml[k] = make_float2(-FLT_MAX, 0.0f);
    ov[k] = 0.0f;
    if (k < cluster) {
      ml[k] = ld_cluster2(cluster_address(own.ml + 2 * h, k));
      ov[k] = ld_cluster(cluster_address(own.o + h * m.dv + e, k));
    }
  }
  const float2 pre = pm.ml[kSel];
  float mx = pre.y > 0.0f ? pre.x : -FLT_MAX;
#pragma unroll
  for (int k = 0; k < kPicksCluster; ++k) mx = ml[k].y > 0.0f ? fmaxf(mx, ml[k].x) : mx;
  float l = 0.0f, a = 0.0f;
  if (pre.y > 0.0f) {
    const float w = __expf(pre.x - mx);
    l = w * pre.y, a = w * pm.o[kSel];
  }
#pragma unroll
  for (int k = 0; k < kPicksCluster; ++k) {
    const bool live = ml[k].y > 0.0f;  // junk o of an empty partial: never multiplied
    const float w = live ? __expf(ml[k].x - mx) : 0.0f;
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
