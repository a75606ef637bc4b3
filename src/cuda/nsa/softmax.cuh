// The softmax pieces the tensor-core attention kernels share: the forward's online-softmax state
// of one warp's 16 MMA rows, and the backward's per-row statistics with dS = P ∘ (g·dP − delta),
// P recomputed from the saved log-sum-exp.
#pragma once

#include "tiles.cuh"

namespace nsa::cuda {

// Online-softmax state of one warp's 16 rows (each thread: rows gid and gid + 8).
template <int DV>
struct SoftmaxAcc {
  float o[DV / 8][4];
  float m[2], l[2];

  __device__ void init() {
#pragma unroll
    for (int nt = 0; nt < DV / 8; ++nt) o[nt][0] = o[nt][1] = o[nt][2] = o[nt][3] = 0.0f;
    m[0] = m[1] = -INFINITY;
    l[0] = l[1] = 0.0f;
  }

  // s: scores already scaled to the log2 domain, −inf where masked. Turns s into P and rescales o.
  template <int NT>
  __device__ void update(float s[][4]) {
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      mx[0] = fmaxf(mx[0], fmaxf(s[nt][0], s[nt][1]));
      mx[1] = fmaxf(mx[1], fmaxf(s[nt][2], s[nt][3]));
    }
    // base: the new running max, or 0 while a row has seen no key (all its s are -inf, and
    // 2^(-inf - 0) = 0 without a test per element; o and l are still 0, so alpha = 0 is harmless).
    float alpha[2], base[2], sum[2] = {0.0f, 0.0f};
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float mn = fmaxf(m[r], quad_max(mx[r]));
      base[r] = mn == -INFINITY ? 0.0f : mn;
      alpha[r] = fast_exp2(m[r] - base[r]);
      m[r] = mn;
    }
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float pr = fast_exp2(s[nt][e] - base[e >> 1]);
        s[nt][e] = pr;
        sum[e >> 1] += pr;
      }
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) l[r] = l[r] * alpha[r] + sum[r];
#pragma unroll
    for (int nt = 0; nt < DV / 8; ++nt) {
      o[nt][0] *= alpha[0], o[nt][1] *= alpha[0];
      o[nt][2] *= alpha[1], o[nt][3] *= alpha[1];
    }
  }

  // Row r's (0: gid, 1: gid + 8) normaliser and natural-log lse; call after `finish`.
  __device__ void finish() {
    l[0] = quad_sum(l[0]);
    l[1] = quad_sum(l[1]);
  }
  __device__ float inv(int r) const {
    return l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
  }
  __device__ float lse(int r) const {
    return l[r] > 0.0f ? (m[r] + log2f(l[r])) * kLn2 : -INFINITY;
  }
};

// Per row half (r = 0: gid, 1: gid + 8): lse (log2 units), delta and gate of branch c. A row
// that is padding or sees no key gets lse2 = +inf, so that P = 2^(s - lse2) = 0 for every s.
struct RowStats {
  float lse2[2], delta[2], gate[2];
  __device__ void load(const NsaParams& p, int c, int64_t th_lo, int64_t th_hi, bool ok_lo,
                       bool ok_hi) {
    const int64_t th[2] = {th_lo, th_hi};
    const bool ok[2] = {ok_lo, ok_hi};
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float lse = ok[r] ? p.lse[c][th[r]] : -INFINITY;
      lse2[r] = lse == -INFINITY ? INFINITY : lse * kLog2e;
      delta[r] = ok[r] ? p.delta[c][th[r]] : 0.0f;
      gate[r] = ok[r] ? __bfloat162float(p.gate[c][th[r]]) : 0.0f;
    }
  }
};

// s := dS from S (scaled to the log2 domain, −inf where masked) and dP.
template <int NT>
__device__ __forceinline__ void scores_to_ds(float s[][4], const float dp[][4],
                                             const RowStats& st) {
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int r = e >> 1;
      const float pr = fast_exp2(s[nt][e] - st.lse2[r]);
      s[nt][e] = pr * (st.gate[r] * dp[nt][e] - st.delta[r]);
    }
  }
}

}  // namespace nsa::cuda
