// Device building blocks shared by the NSA forward and backward kernels (v1, SIMT, fp32 math).
//
// A CTA serves one (query row, group); `attend_head` runs softmax attention of one head over a
// list of key rows with the whole CTA: thread-strided scores into shared memory, block max/sum,
// probabilities, then one thread per output channel summing over keys in ascending order – no
// atomics, so results are deterministic. Key lists are functors j -> row (relative to the
// sequence's first row of K/V).
#pragma once

#include <cuda_bf16.h>

#include <cmath>

#include "common/block_reduce.cuh"
#include "nsa_params.h"

namespace nsa::cuda {

__device__ __forceinline__ float to_float(float x) {
  return x;
}
__device__ __forceinline__ float to_float(bf16 x) {
  return __bfloat162float(x);
}

template <typename KT>
__device__ __forceinline__ float dot_row(const float* __restrict__ q, const KT* __restrict__ k,
                                         int64_t n) {
  float acc = 0.0f;
  for (int64_t c = 0; c < n; ++c) acc += q[c] * to_float(k[c]);
  return acc;
}

// Key rows of each branch for query t of a sequence.
struct WindowKeys {
  int64_t first;
  __device__ int64_t operator()(int64_t j) const { return first + j; }
};
struct CompressedKeys {
  __device__ int64_t operator()(int64_t j) const { return j; }
};
// Selected blocks, ascending; only the last (the current block c) may be partial.
struct SelectedKeys {
  const int32_t* blocks;  // shared memory
  int64_t l_sel;
  __device__ int64_t operator()(int64_t j) const { return blocks[j / l_sel] * l_sel + j % l_sel; }
};

// Softmax attention of head `q` over n keys. On return: probs[j] = p_j (shared memory), out[c]
// (shared, dv floats) = Σ_j p_j v_j; returns the log-sum-exp (-inf and out = 0 when n = 0).
template <typename KT, typename Rows>
__device__ float attend_head(const float* __restrict__ q, const KT* __restrict__ K,
                             const KT* __restrict__ V, int64_t k_stride, int64_t v_stride,
                             int64_t n, Rows rows, int64_t dk, int64_t dv, float scale,
                             float* probs, float* red, float* out) {
  if (n == 0) {
    for (int64_t c = threadIdx.x; c < dv; c += blockDim.x) out[c] = 0.0f;
    __syncthreads();
    return -INFINITY;
  }
  float m = -INFINITY;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
    const float s = scale * dot_row(q, K + rows(j) * k_stride, dk);
    probs[j] = s;
    m = fmaxf(m, s);
  }
  m = block_max(m, red);
  float sum = 0.0f;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
    const float e = expf(probs[j] - m);
    probs[j] = e;
    sum += e;
  }
  sum = block_sum(sum, red);
  const float inv = 1.0f / sum;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) probs[j] *= inv;
  __syncthreads();
  for (int64_t c = threadIdx.x; c < dv; c += blockDim.x) {
    float acc = 0.0f;
    for (int64_t j = 0; j < n; ++j) acc += probs[j] * to_float(V[rows(j) * v_stride + c]);
    out[c] = acc;
  }
  __syncthreads();
  return m + logf(sum);
}

// Shared-memory bounds for a CTA serving one query of the longest sequence: compressed tokens
// (+1 so it is never 0), and keys of any one branch (compressed, selected or window).
__host__ __device__ inline int64_t max_compressed_tokens(const NsaParams& p) {
  return p.max_len < p.l ? 1 : (p.max_len - p.l) / p.d + 2;
}
__host__ __device__ inline int64_t max_branch_keys(const NsaParams& p) {
  int64_t keys = p.n_sel * p.l_sel;
  if (p.w > keys) keys = p.w;
  const int64_t nc = max_compressed_tokens(p);
  return nc > keys ? nc : keys;
}

// Visible compressed tokens for query t: i·d + l <= t + 1.
__device__ __forceinline__ int64_t num_visible(const NsaParams& p, int64_t t) {
  return t + 1 < p.l ? 0 : (t + 1 - p.l) / p.d + 1;
}

}  // namespace nsa::cuda
