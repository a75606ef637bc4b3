// Merging the decode parts' partial softmax results (decode_params.cuh): (max m, sum of exp l,
// unnormalised o) per part and head. A group merge folds kGroupParts compressed parts into one
// partial of the same kind; the combine merges each branch's slots and gates the branches into o.
// Every sum runs in a fixed order (parts ascending, fixed thread roles), with no atomics, so the
// result is the same bits whichever CTA runs it and whatever else is in the batch. Partials are
// read with ld.global.cg (L2): other CTAs of the kernel (or of the kernels before) wrote them.
#pragma once

#include <cfloat>

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

// Σ over slots first + start, first + start + stride, … < end of w_p · o_p[e4 .. e4 + 3] for head
// h, w_p = exp(m_p − mx) · scale (0 for empty parts, whose o is junk: loaded, never multiplied).
__device__ __forceinline__ float4 weighted_sum(const DecodeDims& m, const float* part_ml,
                                               const float* part_o, int bg, int h, int e4,
                                               int first, int end, int start, int stride, float mx,
                                               float scale, float4 acc) {
#pragma unroll 4
  for (int p = first + start; p < end; p += stride) {
    const int64_t pi = part_index(m, bg, p) + h;
    const float2 ml = __ldcg(reinterpret_cast<const float2*>(part_ml + 2 * pi));
    const float4 ov = __ldcg(reinterpret_cast<const float4*>(part_o + pi * m.dv + e4));
    const bool live = ml.y > 0.0f;
    const float wgt = live ? __expf(ml.x - mx) * scale : 0.0f;
    acc.x += live ? wgt * ov.x : 0.0f;
    acc.y += live ? wgt * ov.y : 0.0f;
    acc.z += live ? wgt * ov.z : 0.0f;
    acc.w += live ? wgt * ov.w : 0.0f;
  }
  return acc;
}

// Compressed parts [first, end) of group-row bg merged into slot `out`: per head M = their merged
// max, L = their sum rescaled to it, o = Σ exp(m_p − M) · o_p in part order. Every thread of the
// CTA calls it (a barrier inside).
__device__ void merge_group(const DecodeDims& m, float* part_ml, float* part_o, int bg, int first,
                            int end, int out) {
  __shared__ float head_max[kMaxHeadsPerGroup];
  const int h = threadIdx.x;
  if (h < m.hpg) {
    float mx = -FLT_MAX, sum = 0.0f;
    fold_slots(m, part_ml, bg, h, first, end, 0, 1, mx, sum);
    head_max[h] = mx;
    *reinterpret_cast<float2*>(part_ml + 2 * (part_index(m, bg, out) + h)) = make_float2(mx, sum);
  }
  __syncthreads();
  const int per_head = m.dv / 4;
  for (int i = threadIdx.x; i < m.hpg * per_head; i += blockDim.x) {
    const int hh = i / per_head, e4 = 4 * (i % per_head);
    const float4 acc = weighted_sum(m, part_ml, part_o, bg, hh, e4, first, end, 0, 1, head_max[hh],
                                    1.0f, make_float4(0, 0, 0, 0));
    *reinterpret_cast<float4*>(part_o + (part_index(m, bg, out) + hh) * m.dv + e4) = acc;
  }
  __syncthreads();  // head_max is reused by the next call
}

// The branches a combine merges: slots [lo[r], hi[r]) for branch r < n, each weighted by its gate
// (gate[r] [B, H] bf16; nullptr: 1).
struct Branches {
  int n;
  int lo[kNumBranches], hi[kNumBranches];
  const bf16* gate[kNumBranches];
};

constexpr int kStatLanes = 8;  // lanes per (head, branch) in the combine's statistics

// o [B, H, dv] (bf16) of heads h0 .. h0 + nh − 1 of group g of sequence b: per head and branch the
// merged max M and sum L of the branch's slots, then o = Σ_r gate_r / L_r · Σ_p exp(m_p − M_r) ·
// o_p (branches in order, slots ascending). Threads beyond the output's float4s split the slots
// (round robin) and their sums are added in split order. Every thread of the CTA calls it.
__device__ void combine(const DecodeDims& m, const float* part_ml, const float* part_o, int b,
                        int g, int h0, int nh, const Branches& br, bf16* o) {
  __shared__ float stat_max[kMaxHeadsPerGroup][kNumBranches];
  __shared__ float stat_scale[kMaxHeadsPerGroup][kNumBranches];
  __shared__ float4 split_acc[kPartThreads];
  const int bg = b * m.G + g, H = m.G * m.hpg;
  // Statistics: kStatLanes lanes per (head, branch) pair, rounds uniform over the warp.
  const int lane8 = threadIdx.x % kStatLanes, teams = blockDim.x / kStatLanes;
  const int pairs = nh * br.n;
  for (int base = 0; base < pairs; base += teams) {
    const int pair = base + threadIdx.x / kStatLanes;
    const bool active = pair < pairs;
    const int hh = active ? pair / br.n : 0, r = active ? pair % br.n : 0;
    float mx = -FLT_MAX, sum = 0.0f;
    if (active) fold_slots(m, part_ml, bg, h0 + hh, br.lo[r], br.hi[r], lane8, kStatLanes, mx, sum);
    lanes_fold(mx, sum, kStatLanes);
    if (active && lane8 == 0) {
      const int64_t gi = static_cast<int64_t>(b) * H + g * m.hpg + h0 + hh;
      const float gv = br.gate[r] ? __bfloat162float(br.gate[r][gi]) : 1.0f;
      stat_max[hh][r] = mx;
      stat_scale[hh][r] = sum > 0.0f ? gv / sum : 0.0f;
    }
  }
  __syncthreads();
  const int per_head = m.dv / 4, items = nh * per_head;
  const int splits = max(1, static_cast<int>(blockDim.x) / items);
  const auto store = [&](int item, float4 acc) {
    const int hh = item / per_head, e4 = 4 * (item % per_head);
    const int64_t gi = static_cast<int64_t>(b) * H + g * m.hpg + h0 + hh;
    __nv_bfloat162* dst = reinterpret_cast<__nv_bfloat162*>(o + gi * m.dv + e4);
    dst[0] = __floats2bfloat162_rn(acc.x, acc.y);
    dst[1] = __floats2bfloat162_rn(acc.z, acc.w);
  };
  if (splits == 1) {
    for (int item = threadIdx.x; item < items; item += blockDim.x) {
      const int hh = item / per_head, e4 = 4 * (item % per_head);
      float4 acc = make_float4(0, 0, 0, 0);
      for (int r = 0; r < br.n; ++r) {
        acc = weighted_sum(m, part_ml, part_o, bg, h0 + hh, e4, br.lo[r], br.hi[r], 0, 1,
                           stat_max[hh][r], stat_scale[hh][r], acc);
      }
      store(item, acc);
    }
    return;
  }
  const int item = threadIdx.x % items, split = threadIdx.x / items;
  const int hh = item / per_head, e4 = 4 * (item % per_head);
  if (split < splits) {
    float4 acc = make_float4(0, 0, 0, 0);
    for (int r = 0; r < br.n; ++r) {
      acc = weighted_sum(m, part_ml, part_o, bg, h0 + hh, e4, br.lo[r], br.hi[r], split, splits,
                         stat_max[hh][r], stat_scale[hh][r], acc);
    }
    split_acc[threadIdx.x] = acc;
  }
  __syncthreads();
  if (split == 0) {
    float4 acc = split_acc[item];
    for (int s = 1; s < splits; ++s) {
      const float4 x = split_acc[s * items + item];
      acc.x += x.x, acc.y += x.y, acc.z += x.z, acc.w += x.w;
    }
    store(item, acc);
  }
}

}  // namespace nsa::cuda::decode
