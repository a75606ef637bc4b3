// NSA decode kernels: append, compressed parts, block top-n, attention parts, combine (see
// nsa_decode.h). Decoding reads little per step (tens of KB to a few MB), so every kernel is
// written for latency: many small CTAs over key chunks, fp32 math on bf16 caches, no atomics.
#include "nsa_decode.h"

#include <algorithm>
#include <cfloat>
#include <climits>

#include "common/dependent_launch.cuh"
#include "common/mma.cuh"
#include "nsa/error.h"

namespace nsa::cuda {
namespace {

using bf16 = __nv_bfloat16;
constexpr int kMaxHeadsPerGroup = 16;
constexpr int kThreads = 128;

// Sizes of one decoder (int: head dims, block sizes and part counts are small; row offsets are
// computed in 64 bits where they multiply).
struct DecodeDims {
  int G, hpg, dk, dv, l, d, l_sel, n_sel, w, sub, win_parts;
  int64_t max_len, max_cmp;
  int cmp_parts, attn_parts;
  int sel_chunk, sel_chunks;  // candidate blocks per block_topk CTA, CTAs per (sequence, group)
  float scale;
};

struct Candidate;

// The one parameter struct every decode kernel takes (as NsaParams for the training kernels):
// the sizes, the step's inputs and outputs, the caches and the scratch between the kernels.
// Caches are [B, rows, G, dk|dv] (bf16); the dense baseline leaves the NSA-only ones null.
struct DecodeParams {
  DecodeDims dims;
  bool dense;
  const int32_t* pos;  // [B] each sequence's position this step
  // Inputs: q [B, H, dk]; the token's K/V per branch (kv = shared: all three the same) [B, G,
  // dk|dv]; gates per branch [B, H].
  const bf16* q;
  const bf16* k_in[kNumBranches];
  const bf16* v_in[kNumBranches];
  const bf16* gate[kNumBranches];
  // Caches: every position (selected branch and dense), the window ring, the ring of the last l
  // raw rows, the compressed tokens.
  bf16 *k_sel, *v_sel, *k_win, *v_win, *k_raw, *v_raw, *k_cmp, *v_cmp;
  // Scratch: compressed scores [B, H, max_cmp], per-part (max, sum) and outputs, block candidates.
  float *scores, *part_ml, *part_o;
  Candidate* cand;
  // Outputs: the selected blocks [B, G, n_sel] (NSA) and o [B, H·dv].
  int32_t* sel;
  bf16* o;
};

__device__ __forceinline__ int num_cmp(const DecodeDims& m, int t) {
  return t + 1 < m.l ? 0 : (t + 1 - m.l) / m.d + 1;
}

// Row pointers of the caches: [B, rows, G, dim].
template <typename T>  // bf16 or const bf16
__device__ __forceinline__ T* row(T* base, int b, int64_t rows, int64_t r, int g,
                                  const DecodeDims& m, int dim) {
  return base + ((static_cast<int64_t>(b) * rows + r) * m.G + g) * dim;
}

__global__ void append_kernel(const DecodeParams params) {
  const DecodeDims& m = params.dims;
  const bool dense = params.dense;
  const int32_t* pos = params.pos;
  const bf16 *k_sel_in = params.k_in[kSel], *v_sel_in = params.v_in[kSel];
  const bf16 *k_win_in = params.k_in[kWin], *v_win_in = params.v_in[kWin];
  const bf16 *k_cmp_in = params.k_in[kCmp], *v_cmp_in = params.v_in[kCmp];
  bf16 *k_sel = params.k_sel, *v_sel = params.v_sel, *k_win = params.k_win, *v_win = params.v_win;
  bf16 *k_raw = params.k_raw, *v_raw = params.v_raw, *k_cmp = params.k_cmp, *v_cmp = params.v_cmp;
  wait_for_previous_kernel();
  const int b = blockIdx.x, g = blockIdx.y, t = pos[b];
  const int64_t in_k = (static_cast<int64_t>(b) * m.G + g) * m.dk;
  const int64_t in_v = (static_cast<int64_t>(b) * m.G + g) * m.dv;
  const auto at = [&](bf16* base, int64_t rows, int64_t r, int dim) {
    return row(base, b, rows, r, g, m, dim);
  };
  for (int i = threadIdx.x; i < m.dk; i += blockDim.x) {
    at(k_sel, m.max_len, t, m.dk)[i] = k_sel_in[in_k + i];
    if (dense) continue;
    at(k_win, m.w, t % m.w, m.dk)[i] = k_win_in[in_k + i];
    at(k_raw, m.l, t % m.l, m.dk)[i] = k_cmp_in[in_k + i];
  }
  for (int i = threadIdx.x; i < m.dv; i += blockDim.x) {
    at(v_sel, m.max_len, t, m.dv)[i] = v_sel_in[in_v + i];
    if (dense) continue;
    at(v_win, m.w, t % m.w, m.dv)[i] = v_win_in[in_v + i];
    at(v_raw, m.l, t % m.l, m.dv)[i] = v_cmp_in[in_v + i];
  }
  if (dense || t + 1 < m.l || (t + 1 - m.l) % m.d != 0) return;
  __syncthreads();  // the ring rows written above are read below by other threads
  // φ = avg over positions t − l + 1 .. t, oldest first.
  const int n = (t + 1 - m.l) / m.d;
  const float inv_l = 1.0f / static_cast<float>(m.l);
  for (int i = threadIdx.x; i < m.dk + m.dv; i += blockDim.x) {
    const bool is_k = i < m.dk;
    const int e = is_k ? i : i - m.dk, dim = is_k ? m.dk : m.dv;
    bf16* ring = is_k ? k_raw : v_raw;
    float s = 0.0f;
    for (int r = 0; r < m.l; ++r)
      s += __bfloat162float(at(ring, m.l, (t - m.l + 1 + r) % m.l, dim)[e]);
    at(is_k ? k_cmp : v_cmp, m.max_cmp, n, dim)[e] = __float2bfloat16(s * inv_l);
  }
}

// Scores of the group's hpg heads against `count` ≤ P keys (rows first .. first + count − 1,
// modulo w for the window ring), the part's max and sum of exp, and its unnormalised output.
// Shared by the compressed parts and the attention parts; s_out (optional) receives the scores.
// Latency is what matters for NSA parts (a few dozen CTAs per sequence), so every load they need
// is in flight at once: the caller starts copying q (issue_q), then attend_part starts copying
// the first v_rows(P, dv) value rows (cp.async into shared memory) and loads each thread's key
// row (one key per thread, a slab of 16-byte loads into registers) before it waits for any of
// them – one memory round trip, not three. Dense parts tile the whole cache (hundreds of CTAs),
// so they keep registers and shared memory low enough for four CTAs per SM instead: a slab of
// four loads and 64 staged value rows.
constexpr int kPartThreads = 256, kPairsPerThread = 8, kVBufBytes = 32 * 1024;

// 16-byte key loads held per thread (8: 64 dims), and value rows staged at once (the rest of a
// part, if any, in further chunks).
__host__ __device__ constexpr int key_slab(int part) {
  return part == NsaDecodeCuda::kDensePart ? 4 : 8;
}
__host__ __device__ constexpr int v_rows(int part, int dv) {
  const int cap = part == NsaDecodeCuda::kDensePart ? 64 : part, fit = kVBufBytes / (2 * dv);
  return cap < fit ? cap : fit;
}

template <int P>
struct PartSmem {
  __align__(16) bf16 q_raw[kMaxHeadsPerGroup * 256];  // [hpg, dk], as copied (cp.async)
  float q[kMaxHeadsPerGroup][256];
  float s[kMaxHeadsPerGroup][P];
};

// Starts copying the group's q rows ([hpg, dk] bf16, contiguous) into shared memory.
__device__ void issue_q(const DecodeDims& m, const bf16* q, int b, int g, bf16* q_smem) {
  const bf16* src = q + (static_cast<int64_t>(b) * m.G * m.hpg + g * m.hpg) * m.dk;
  for (int i = threadIdx.x; i < m.hpg * m.dk / 8; i += blockDim.x)
    cp_async16(q_smem + 8 * i, src + 8 * i);
}

template <int P>
__device__ void attend_part(const DecodeDims& m, PartSmem<P>& sm, const bf16* k_base,
                            const bf16* v_base, int64_t rows, int b, int g, int first, int count,
                            bool ring_w, float* s_out, float* ml, bf16* vbuf, float* o_out) {
  static_assert(P <= kPartThreads, "one key per thread");
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, nw = blockDim.x / 32;
  const auto row_of = [&](int c) -> int64_t { return ring_w ? (first + c) % m.w : first + c; };
  const int vec_per_row = m.dv / 8, chunk_rows = v_rows(P, m.dv);
  const auto v_src = [&](int c, int i8) {
    return reinterpret_cast<const uint4*>(row(v_base, b, rows, row_of(c), g, m, m.dv)) + i8;
  };
  for (int idx = threadIdx.x; idx < min(count, chunk_rows) * vec_per_row; idx += blockDim.x)
    cp_async16(vbuf + 8 * idx, v_src(idx / vec_per_row, idx % vec_per_row));
  cp_async_commit();
  const int key = threadIdx.x, n8 = m.dk / 8;
  const bool has_key = key < count;
  const uint4* kr =
      reinterpret_cast<const uint4*>(row(k_base, b, rows, row_of(has_key ? key : 0), g, m, m.dk));
  constexpr int kSlab = key_slab(P);
  uint4 slab[kSlab];
#pragma unroll
  for (int i = 0; i < kSlab; ++i)
    if (has_key && i < n8) slab[i] = kr[i];
  cp_async_wait<0>();
  __syncthreads();  // q and the first value rows have landed
  for (int idx = threadIdx.x; idx < m.hpg * m.dk; idx += blockDim.x)
    sm.q[idx / m.dk][idx % m.dk] = __bfloat162float(sm.q_raw[idx]);
  __syncthreads();
  if (has_key) {
    float acc[kMaxHeadsPerGroup];
#pragma unroll
    for (int h = 0; h < kMaxHeadsPerGroup; ++h) acc[h] = 0.0f;
    for (int s0 = 0; s0 < n8; s0 += kSlab) {
      if (s0 > 0) {  // the next slab of the row
#pragma unroll
        for (int i = 0; i < kSlab; ++i)
          if (s0 + i < n8) slab[i] = kr[s0 + i];
      }
#pragma unroll
      for (int i = 0; i < kSlab; ++i) {
        if (s0 + i >= n8) break;
        const __nv_bfloat162* k2 = reinterpret_cast<const __nv_bfloat162*>(&slab[i]);
        float kf[8];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const float2 f = __bfloat1622float2(k2[j]);
          kf[2 * j] = f.x;
          kf[2 * j + 1] = f.y;
        }
#pragma unroll
        for (int h = 0; h < kMaxHeadsPerGroup; ++h) {
          if (h < m.hpg) {
#pragma unroll
            for (int j = 0; j < 8; ++j) acc[h] += sm.q[h][(s0 + i) * 8 + j] * kf[j];
          }
        }
      }
    }
#pragma unroll
    for (int h = 0; h < kMaxHeadsPerGroup; ++h) {
      if (h < m.hpg) sm.s[h][key] = acc[h] * m.scale;
    }
  }
  __syncthreads();
  // Per head (one warp each): max, then s ← exp(s − max) and its sum.
  for (int h = warp; h < m.hpg; h += nw) {
    float mx = -FLT_MAX;
    for (int c = lane; c < count; c += 32) mx = fmaxf(mx, sm.s[h][c]);
    for (int off = 16; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
    float sum = 0.0f;
    for (int c = lane; c < count; c += 32) {
      if (s_out) s_out[static_cast<int64_t>(h) * m.max_cmp + c] = sm.s[h][c];
      const float p = __expf(sm.s[h][c] - mx);
      sm.s[h][c] = p;
      sum += p;
    }
    for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
    if (lane == 0) {
      ml[2 * h] = count > 0 ? mx : -FLT_MAX;
      ml[2 * h + 1] = sum;
    }
  }
  float acc[kPairsPerThread];  // (h, e) pairs threadIdx.x + k·blockDim.x
#pragma unroll
  for (int k = 0; k < kPairsPerThread; ++k) acc[k] = 0.0f;
  const int pairs = m.hpg * m.dv;
  for (int c0 = 0; c0 < count; c0 += chunk_rows) {
    const int n = min(chunk_rows, count - c0);
    if (c0 > 0) {       // values beyond the staged rows (dv > 64 and long parts only)
      __syncthreads();  // vbuf is free
      for (int idx = threadIdx.x; idx < n * vec_per_row; idx += blockDim.x)
        reinterpret_cast<uint4*>(vbuf)[idx] = *v_src(c0 + idx / vec_per_row, idx % vec_per_row);
    }
    __syncthreads();  // s is final (first chunk) / vbuf is loaded (later chunks)
#pragma unroll
    for (int k = 0; k < kPairsPerThread; ++k) {
      const int idx = threadIdx.x + k * blockDim.x;
      if (idx >= pairs) break;
      const int h = idx / m.dv, e = idx % m.dv;
      const float* sh = sm.s[h] + c0;
      float a[4] = {0.0f, 0.0f, 0.0f, 0.0f};  // four chains: the FMA latency overlaps
      int c = 0;
      for (; c + 4 <= n; c += 4) {
#pragma unroll
        for (int u = 0; u < 4; ++u) a[u] += sh[c + u] * __bfloat162float(vbuf[(c + u) * m.dv + e]);
      }
      for (; c < n; ++c) a[0] += sh[c] * __bfloat162float(vbuf[c * m.dv + e]);
      acc[k] += (a[0] + a[1]) + (a[2] + a[3]);
    }
  }
#pragma unroll
  for (int k = 0; k < kPairsPerThread; ++k) {
    const int idx = threadIdx.x + k * blockDim.x;
    if (idx < pairs) o_out[idx] = acc[k];
  }
  __syncthreads();  // ml is read by the caller
}

// Partials: part_ml [B·G, parts, hpg, 2], part_o [B·G, parts, hpg, dv].
__device__ __forceinline__ int64_t part_index(const DecodeDims& m, int bg, int part) {
  return (static_cast<int64_t>(bg) * (m.cmp_parts + m.attn_parts) + part) * m.hpg;
}

__global__ void __launch_bounds__(kPartThreads) cmp_parts_kernel(const DecodeParams params) {
  const DecodeDims& m = params.dims;
  const int32_t* pos = params.pos;
  const bf16 *q = params.q, *k_cmp = params.k_cmp, *v_cmp = params.v_cmp;
  float *scores = params.scores, *part_ml = params.part_ml, *part_o = params.part_o;
  wait_for_previous_kernel();
  constexpr int P = NsaDecodeCuda::kCmpPart;
  __shared__ PartSmem<P> sm;
  extern __shared__ uint4 vbuf_raw[];
  const int bg = blockIdx.x, b = bg / m.G, g = bg % m.G, part = blockIdx.y;
  const int n = num_cmp(m, pos[b]), first = part * P;
  if (first >= n) return;  // the selection kernel reads parts < ceil(n / kCmpPart) only
  issue_q(m, q, b, g, sm.q_raw);
  const int count = min(P, n - first);
  const int64_t pi = part_index(m, bg, part);
  attend_part<P>(m, sm, k_cmp + static_cast<int64_t>(first) * m.G * m.dk,
                 v_cmp + static_cast<int64_t>(first) * m.G * m.dv, m.max_cmp, b, g, 0, count, false,
                 scores + static_cast<int64_t>(bg) * m.hpg * m.max_cmp + first, part_ml + 2 * pi,
                 reinterpret_cast<bf16*>(vbuf_raw), part_o + pi * m.dv);
}

// Folds a part's (max, sum of exp) into a running pair: the merged max and the sum rescaled to it.
// The same two pairs give the same result in either order (the kept max's side is exact), so
// the lanes of a butterfly agree bit for bit.
__device__ __forceinline__ void fold_stats(float& mx, float& sum, float m2, float s2) {
  if (!(s2 > 0.0f)) return;
  if (m2 > mx) {
    sum = sum * __expf(mx - m2) + s2;
    mx = m2;
  } else {
    sum += s2 * __expf(m2 - mx);
  }
}

// Folds the (max, sum of exp) of parts p = first + start, first + start + stride, … < end of
// head hh of group-row bg into (mx, sum); the loads are issued a few at a time.
__device__ void fold_parts(const DecodeDims& m, const float* part_ml, int bg, int hh, int first,
                           int end, int start, int stride, float& mx, float& sum) {
#pragma unroll 4
  for (int p = first + start; p < end; p += stride) {
    const float2 ml = *reinterpret_cast<const float2*>(part_ml + 2 * (part_index(m, bg, p) + hh));
    fold_stats(mx, sum, ml.x, ml.y);
  }
}

// Folds the pairs of a warp's lanes by shuffles: every lane gets the warp's pair.
__device__ void warp_fold(float& mx, float& sum) {
  for (int off = 16; off > 0; off >>= 1) {
    const float m2 = __shfl_xor_sync(0xffffffffu, mx, off);
    const float s2 = __shfl_xor_sync(0xffffffffu, sum, off);
    fold_stats(mx, sum, m2, s2);
  }
}

// Block scores and a partial top-n, grid (B·G, chunks): each CTA scores the candidate blocks
// [1 + k·chunk, 1 + (k + 1)·chunk) ∩ [1, c − 2] of one (sequence, group) – p_slc of docs/nsa.md
// ("Selection scores"), the group's compressed probabilities (Σ over heads in head order, each
// normalised by its head's merged max and sum) weighted by overlap / l, ascending over compressed
// tokens – and keeps its best `free` = n_sel − forced blocks by (score desc, index asc) in rank
// order. The global top `free` is among the union of the chunks' bests: attn parts merge them
// (select_blocks). Latency: the first kTopkTokens tokens' scores per thread are loaded before the
// heads' merged statistics, so both arrive in one round trip.
struct Candidate {
  float score;  // < 0: empty slot
  int block;
};

constexpr int kTopkThreads = 256, kTopkTokens = 2, kTopkChunk = 64;
constexpr int kMaxTopkChunks = 32;  // per (sequence, group): one lane each in select_blocks' merge

__global__ void __launch_bounds__(kTopkThreads) block_topk_kernel(const DecodeParams params) {
  const DecodeDims& m = params.dims;
  const int32_t* pos = params.pos;
  const float *scores = params.scores, *part_ml = params.part_ml;
  Candidate* cand = params.cand;
  wait_for_previous_kernel();
  extern __shared__ float block_smem[];  // block scores [sel_chunk], then gp [sel_gp]
  __shared__ float head_max[kMaxHeadsPerGroup], head_sum[kMaxHeadsPerGroup];
  const int bg = blockIdx.x, chunk = blockIdx.y, b = bg / m.G, t = pos[b];
  const int n = num_cmp(m, t), parts = (n + NsaDecodeCuda::kCmpPart - 1) / NsaDecodeCuda::kCmpPart;
  const int c = t / m.l_sel, forced = 1 + (c - 1 > 0) + (c > 0), free = m.n_sel - forced;
  Candidate* out = cand + (static_cast<int64_t>(bg) * m.sel_chunks + chunk) * m.n_sel;
  for (int k = threadIdx.x; k < m.n_sel; k += blockDim.x) out[k] = Candidate{-1.0f, INT_MAX};
  const int j0 = 1 + chunk * m.sel_chunk, j1 = min(j0 + m.sel_chunk, c - 1);  // [j0, j1)
  if (j0 >= j1 || free <= 0) return;
  // Compressed tokens i whose raw range [i·d, i·d + l) meets block j: [i_lo(j), i_hi(j)].
  const auto i_lo = [&m](int j) {
    const int lo_num = j * m.l_sel - m.l + 1;
    return lo_num <= 0 ? 0 : (lo_num + m.d - 1) / m.d;
  };
  const auto i_hi = [&m, n](int j) { return min(n - 1, ((j + 1) * m.l_sel - 1) / m.d); };
  const int gi0 = i_lo(j0), gi1 = i_hi(j1 - 1);
  const float* sc = scores + static_cast<int64_t>(bg) * m.hpg * m.max_cmp;
  // Every head's score of token i (independent loads, issued together).
  const auto load = [&](int i, float* x) {
#pragma unroll
    for (int hh = 0; hh < kMaxHeadsPerGroup; ++hh)
      x[hh] = hh < m.hpg && i <= gi1 ? sc[static_cast<int64_t>(hh) * m.max_cmp + i] : 0.0f;
  };
  float x[kTopkTokens][kMaxHeadsPerGroup];
#pragma unroll
  for (int k = 0; k < kTopkTokens; ++k) load(gi0 + threadIdx.x + k * blockDim.x, x[k]);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, nw = blockDim.x / 32;
  for (int h = warp; h < m.hpg; h += nw) {
    float mx = -FLT_MAX, sum = 0.0f;
    fold_parts(m, part_ml, bg, h, 0, parts, lane, 32, mx, sum);
    warp_fold(mx, sum);
    if (lane == 0) {
      head_max[h] = mx;
      head_sum[h] = sum;
    }
  }
  __syncthreads();
  // The group probabilities of the chunk's compressed tokens, staged in shared memory.
  float* block_score = block_smem;
  float* gp = block_smem + m.sel_chunk;
  const auto stage = [&](int i, const float* xi) {
    if (i > gi1) return;
    float p = 0.0f;
#pragma unroll
    for (int hh = 0; hh < kMaxHeadsPerGroup; ++hh)
      if (hh < m.hpg) p += __expf(xi[hh] - head_max[hh]) / head_sum[hh];
    gp[i - gi0] = p;
  };
#pragma unroll
  for (int k = 0; k < kTopkTokens; ++k) stage(gi0 + threadIdx.x + k * blockDim.x, x[k]);
  for (int i = gi0 + threadIdx.x + kTopkTokens * blockDim.x; i <= gi1; i += blockDim.x) {
    load(i, x[0]);
    stage(i, x[0]);
  }
  __syncthreads();
  const float inv_l = 1.0f / static_cast<float>(m.l);
  for (int j = j0 + threadIdx.x; j < j1; j += blockDim.x) {
    float score = 0.0f;  // ascending over the compressed tokens
    for (int i = i_lo(j), hi = i_hi(j); i <= hi; ++i) {
      const int overlap = min(i * m.d + m.l, (j + 1) * m.l_sel) - max(i * m.d, j * m.l_sel);
      score += gp[i - gi0] * static_cast<float>(overlap) * inv_l;
    }
    block_score[j - j0] = score;
  }
  __syncthreads();
  for (int j = j0 + threadIdx.x; j < j1; j += blockDim.x) {
    const float sj = block_score[j - j0];
    int rank = 0;
    for (int k = j0; k < j1 && rank < free; ++k) {
      const float sk = block_score[k - j0];
      rank += (sk > sj || (sk == sj && k < j)) ? 1 : 0;
    }
    if (rank < free) out[rank] = Candidate{sj, j};
  }
}

// The selected blocks of (sequence, group) bg, ascending, −1 padded, into slot[0, n_sel) (shared
// memory; every thread of the CTA calls it): forced 0, c − 1, c, then the best `free` of the
// chunks' candidates by (score desc, index asc). Each chunk's list is already in that order, so
// one warp merges them, a lane per chunk (≤ 32): each round the lanes' heads meet in a warp
// argmax and the winner's lane moves on – `free` rounds, whatever the number of chunks.
constexpr int kMaxSel = 64, kMaxCandidates = kMaxTopkChunks * kMaxSel;

struct SelectScratch {
  Candidate cand[kMaxCandidates];
  int list[kMaxSel];
};

__device__ __forceinline__ bool beats(const Candidate& a, const Candidate& b) {
  return a.score > b.score || (a.score == b.score && a.block < b.block);
}

__device__ void select_blocks(const DecodeDims& m, int t, const Candidate* cand, int bg,
                              SelectScratch& sh, int* slot) {
  const int c = t / m.l_sel, forced = 1 + (c - 1 > 0) + (c > 0), free = m.n_sel - forced;
  const int chunks = min(m.sel_chunks, (max(0, c - 2) + m.sel_chunk - 1) / m.sel_chunk);
  const int picks = max(0, min(c - 2, free)), nc = picks > 0 ? chunks * m.n_sel : 0;
  const Candidate* in = cand + static_cast<int64_t>(bg) * m.sel_chunks * m.n_sel;
  for (int k = threadIdx.x; k < nc; k += blockDim.x) sh.cand[k] = in[k];
  if (threadIdx.x == 0) {
    sh.list[0] = 0;
    if (c - 1 > 0) sh.list[1] = c - 1;
    if (c > 0) sh.list[forced - 1] = c;
  }
  __syncthreads();
  if (chunks == 1) {  // one list: already the answer
    for (int r = threadIdx.x; r < picks; r += blockDim.x) sh.list[forced + r] = sh.cand[r].block;
  } else if (threadIdx.x < 32 && picks > 0) {
    const int lane = threadIdx.x;
    const Candidate none{-1.0f, INT_MAX};
    int head = 0;  // this lane's next entry: its chunk's list holds ≥ min(free, blocks) valid ones
    const auto at_head = [&] {
      const Candidate x = lane < chunks && head < m.n_sel ? sh.cand[lane * m.n_sel + head] : none;
      return x.score < 0.0f ? none : x;
    };
    Candidate x = at_head();
    for (int r = 0; r < picks; ++r) {
      Candidate best = x;
      for (int off = 16; off > 0; off >>= 1) {
        const Candidate y{__shfl_xor_sync(0xffffffffu, best.score, off),
                          __shfl_xor_sync(0xffffffffu, best.block, off)};
        if (beats(y, best)) best = y;
      }
      if (lane == 0) sh.list[forced + r] = best.block;
      if (x.block == best.block) {  // blocks are distinct: this lane won the round
        ++head;
        x = at_head();
      }
    }
  }
  __syncthreads();
  const int total = forced + picks;
  for (int k = threadIdx.x; k < m.n_sel; k += blockDim.x) slot[k] = -1;
  __syncthreads();
  for (int k = threadIdx.x; k < total; k += blockDim.x) {
    int at = 0;  // ascending position: the entries below it (all distinct)
    for (int q = 0; q < total; ++q) at += sh.list[q] < sh.list[k] ? 1 : 0;
    if (at < m.n_sel) slot[at] = sh.list[k];
  }
  __syncthreads();
}

// Attention parts after the compressed ones: NSA – n_sel·sub selected sub-blocks, then win_parts
// window chunks; dense – chunks of kAttnPart positions from 0. Empty parts write l = 0. The CTAs
// of selected parts each merge the block candidates (part 0 also writes the selection out).
template <int P>
__global__ void __launch_bounds__(kPartThreads) attn_parts_kernel(const DecodeParams params) {
  const DecodeDims& m = params.dims;
  const bool dense = params.dense;
  const int32_t* pos = params.pos;
  const bf16* q = params.q;
  const Candidate* cand = params.cand;
  int32_t* sel = params.sel;
  const bf16 *k_sel = params.k_sel, *v_sel = params.v_sel, *k_win = params.k_win,
             *v_win = params.v_win;
  float *part_ml = params.part_ml, *part_o = params.part_o;
  wait_for_previous_kernel();
  __shared__ PartSmem<P> sm;
  __shared__ float ml[2 * kMaxHeadsPerGroup];
  __shared__ int slot[kMaxSel];
  extern __shared__ uint4 vbuf_raw[];  // value rows [v_rows(P, dv), dv], then the SelectScratch
  const int bg = blockIdx.x, b = bg / m.G, g = bg % m.G, part = blockIdx.y, t = pos[b];
  issue_q(m, q, b, g, sm.q_raw);  // in flight while the selection is merged
  int first = 0, count = 0;
  bool window = false;
  if (dense) {
    first = part * P;
    count = max(0, min(P, t + 1 - first));
  } else if (part < m.n_sel * m.sub) {
    select_blocks(m, t, cand, bg,
                  *reinterpret_cast<SelectScratch*>(vbuf_raw + v_rows(P, m.dv) * m.dv / 8), slot);
    if (part == 0) {
      for (int k = threadIdx.x; k < m.n_sel; k += blockDim.x)
        sel[static_cast<int64_t>(bg) * m.n_sel + k] = slot[k];
    }
    const int j = slot[part / m.sub];
    if (j >= 0) {
      first = j * m.l_sel + (part % m.sub) * P;
      count = max(0, min(min(P, (j + 1) * m.l_sel - first), t + 1 - first));
    }
  } else {
    const int start = max(0, t - m.w + 1);
    first = start + (part - m.n_sel * m.sub) * P;
    count = max(0, min(P, t + 1 - first));
    window = true;
  }
  const int64_t pi = part_index(m, bg, m.cmp_parts + part);
  if (count == 0) {
    for (int h = threadIdx.x; h < m.hpg; h += blockDim.x) {
      part_ml[2 * (pi + h)] = -FLT_MAX;
      part_ml[2 * (pi + h) + 1] = 0.0f;
    }
    cp_async_commit();
    cp_async_wait<0>();  // q's copy lands before the CTA's shared memory is released
    return;
  }
  attend_part<P>(m, sm, window ? k_win : k_sel, window ? v_win : v_sel, window ? m.w : m.max_len, b,
                 g, first, count, window, nullptr, ml, reinterpret_cast<bf16*>(vbuf_raw),
                 part_o + pi * m.dv);
  for (int h = threadIdx.x; h < 2 * m.hpg; h += blockDim.x) part_ml[2 * pi + h] = ml[h];
}

// One CTA per (sequence, head): merges the compressed, selected and window parts (dense: the
// parts over 0..t) and gates the branches. One warp per branch merges its parts' statistics in one
// pass; then every part's output, weighted by gate · exp(m_p − M) / L of its branch, is summed by
// blockDim / dv groups of threads (one thread per channel, parts dealt round robin), whose sums
// are added in group order – deterministic.
__global__ void combine_kernel(const DecodeParams params) {
  const DecodeDims& m = params.dims;
  const bool dense = params.dense;
  const int32_t* pos = params.pos;
  const float *part_ml = params.part_ml, *part_o = params.part_o;
  const bf16 *g_cmp = params.gate[kCmp], *g_sel = params.gate[kSel], *g_win = params.gate[kWin];
  bf16* o = params.o;
  wait_for_previous_kernel();
  __shared__ float branch_max[kNumBranches], branch_scale[kNumBranches];
  __shared__ float group_acc[kPartThreads];
  const int b = blockIdx.x, h = blockIdx.y, g = h / m.hpg, hh = h % m.hpg;
  const int bg = b * m.G + g, t = pos[b], H = m.G * m.hpg;
  const int64_t gi = static_cast<int64_t>(b) * H + h;
  int lo[kNumBranches], hi[kNumBranches], branches = 1;
  if (dense) {
    lo[0] = m.cmp_parts;
    hi[0] = lo[0] + t / NsaDecodeCuda::kDensePart + 1;
  } else {
    branches = kNumBranches;
    lo[kCmp] = 0;
    hi[kCmp] = (num_cmp(m, t) + NsaDecodeCuda::kCmpPart - 1) / NsaDecodeCuda::kCmpPart;
    lo[kSel] = m.cmp_parts;
    hi[kSel] = lo[kSel] + m.n_sel * m.sub;
    lo[kWin] = hi[kSel];
    hi[kWin] = lo[kWin] + m.win_parts;
  }
  const int warp = threadIdx.x / 32;
  if (warp < branches) {  // one warp per branch: its parts' merged max and sum of exp
    float mx = -FLT_MAX, sum = 0.0f;
    fold_parts(m, part_ml, bg, hh, lo[warp], hi[warp], threadIdx.x % 32, 32, mx, sum);
    warp_fold(mx, sum);
    if (threadIdx.x % 32 == 0) {
      const bf16* gate = warp == kCmp ? g_cmp : warp == kSel ? g_sel : g_win;
      const float gv = dense ? 1.0f : __bfloat162float(gate[gi]);
      branch_max[warp] = mx;
      branch_scale[warp] = sum > 0.0f ? gv / sum : 0.0f;
    }
  }
  __syncthreads();
  const int groups = blockDim.x / m.dv, grp = threadIdx.x / m.dv, e = threadIdx.x % m.dv;
  float acc = 0.0f;
  if (grp < groups) {
    for (int r = 0; r < branches; ++r) {
      const float M = branch_max[r], scale = branch_scale[r];
#pragma unroll 4
      for (int p = lo[r] + grp; p < hi[r]; p += groups) {
        const int64_t pi = part_index(m, bg, p) + hh;
        const float2 ml = *reinterpret_cast<const float2*>(part_ml + 2 * pi);
        const float ov = part_o[pi * m.dv + e];  // loaded unconditionally: empty parts hold junk
        acc += ml.y > 0.0f ? ov * (__expf(ml.x - M) * scale) : 0.0f;
      }
    }
  }
  group_acc[threadIdx.x] = acc;
  __syncthreads();
  if (grp == 0) {
    for (int k = 1; k < groups; ++k) acc += group_acc[k * m.dv + e];
    o[gi * m.dv + e] = __float2bfloat16(acc);
  }
}

__global__ void fill_random_kernel(bf16* x, int64_t n, uint64_t seed) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    uint64_t z = seed + 0x9e3779b97f4a7c15ull * static_cast<uint64_t>(i + 1);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    x[i] =
        __float2bfloat16(static_cast<float>(z >> 40) / static_cast<float>(1 << 24) * 2.0f - 1.0f);
  }
}

template <typename Kernel>
void allow_dynamic_smem(Kernel kernel, size_t bytes) {
  cudaFuncAttributes attr{};
  NSA_CUDA_CHECK(cudaFuncGetAttributes(&attr, kernel));
  if (static_cast<size_t>(attr.maxDynamicSharedSizeBytes) < bytes) {
    NSA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(bytes)));
  }
}

DecodeDims dims_of(const NsaConfig& c, int64_t max_len, int64_t max_cmp, int cmp_parts,
                   int attn_parts, int sel_chunk, int sel_chunks) {
  DecodeDims m{};
  m.G = static_cast<int>(c.groups);
  m.hpg = static_cast<int>(c.heads / c.groups);
  m.dk = static_cast<int>(c.dk);
  m.dv = static_cast<int>(c.dv);
  m.l = static_cast<int>(c.l);
  m.d = static_cast<int>(c.d);
  m.l_sel = static_cast<int>(c.l_sel);
  m.n_sel = static_cast<int>(c.n_sel);
  m.w = static_cast<int>(c.w);
  m.sub = static_cast<int>((c.l_sel + NsaDecodeCuda::kAttnPart - 1) / NsaDecodeCuda::kAttnPart);
  m.win_parts = static_cast<int>((c.w + NsaDecodeCuda::kAttnPart - 1) / NsaDecodeCuda::kAttnPart);
  m.max_len = max_len;
  m.max_cmp = max_cmp;
  m.cmp_parts = cmp_parts;
  m.attn_parts = attn_parts;
  m.sel_chunk = sel_chunk;
  m.sel_chunks = sel_chunks;
  m.scale = static_cast<float>(c.softmax_scale());
  return m;
}

}  // namespace

NsaDecodeCuda::NsaDecodeCuda(const NsaConfig& cfg, int64_t batch, int64_t max_len, bool dense)
    : cfg_(cfg), B_(batch), max_len_(max_len), dense_(dense) {
  cfg.validate();
  NSA_CHECK(batch > 0 && max_len > 0, "decode: batch and max length must be positive");
  NSA_CHECK(cfg.phi == Phi::kAvg, "decode on the GPU supports phi = avg only");
  const int64_t hpg = cfg.heads / cfg.groups;
  NSA_CHECK(
      hpg <= kMaxHeadsPerGroup && cfg.dk <= 256 && cfg.dv <= 256 &&
          hpg * cfg.dv <= kPartThreads * kPairsPerThread && cfg.dk % 8 == 0 && cfg.dv % 8 == 0,
      "decode on the GPU supports up to ", kMaxHeadsPerGroup,
      " heads per group, dk and dv up to 256 and multiples of 8, and heads per group · dv <= ",
      kPartThreads * kPairsPerThread, "; got ", hpg, ", ", cfg.dk, ", ", cfg.dv);
  NSA_CHECK(cfg.n_sel <= 61, "decode on the GPU supports n_sel <= 61, got ", cfg.n_sel);
  const int64_t G = cfg.groups, dk = cfg.dk, dv = cfg.dv, H = cfg.heads;
  max_cmp_ = std::max<int64_t>(1, cfg.num_compressed(max_len));
  cmp_parts_ = dense ? 0 : (max_cmp_ + kCmpPart - 1) / kCmpPart;
  const int64_t sub = (cfg.l_sel + kAttnPart - 1) / kAttnPart;
  // Candidate blocks per block_topk CTA: kTopkChunk, or a multiple of it so that at most
  // kMaxTopkChunks CTAs per (sequence, group) leave candidate lists for the attention parts'
  // warp to merge (a lane per list).
  const int64_t max_blocks = max_len / cfg.l_sel + 1;
  const int64_t span = int64_t{kTopkChunk} * kMaxTopkChunks;
  sel_chunk_ = kTopkChunk * ((max_blocks + span - 1) / span);
  sel_chunks_ = (max_blocks + sel_chunk_ - 1) / sel_chunk_;
  NSA_CHECK(block_topk_smem_bytes() <= 160 * 1024, "decode on the GPU: max length ", max_len,
            " needs more shared memory for the block scores than a CTA has; shorten it");
  attn_parts_ = dense ? (max_len + kDensePart - 1) / kDensePart
                      : cfg.n_sel * sub + (cfg.w + kAttnPart - 1) / kAttnPart;
  k_sel_.resize(B_ * max_len * G * dk);
  v_sel_.resize(B_ * max_len * G * dv);
  if (!dense) {
    k_win_.resize(B_ * cfg.w * G * dk);
    v_win_.resize(B_ * cfg.w * G * dv);
    k_raw_.resize(B_ * cfg.l * G * dk);
    v_raw_.resize(B_ * cfg.l * G * dv);
    k_cmp_.resize(B_ * max_cmp_ * G * dk);
    v_cmp_.resize(B_ * max_cmp_ * G * dv);
    scores_.resize(B_ * H * max_cmp_);
    candidates_.resize(B_ * G * sel_chunks_ * cfg.n_sel * 2);
    sel_.resize(B_ * G * cfg.n_sel);
    sel_.zero();
  }
  // Dynamic shared memory beyond the default 48 KiB (the staged value rows, up to 32 KiB, beside up
  // to 40 KiB static; the NSA attention parts also hold the selection scratch): raised, never
  // lowered, so every decoder alive (of any shape) can still launch.
  allow_dynamic_smem(block_topk_kernel, block_topk_smem_bytes());
  allow_dynamic_smem(cmp_parts_kernel, part_smem_bytes(kCmpPart, false));
  allow_dynamic_smem(attn_parts_kernel<kAttnPart>, part_smem_bytes(kAttnPart, true));
  allow_dynamic_smem(attn_parts_kernel<kDensePart>, part_smem_bytes(kDensePart, false));
  const int64_t parts = cmp_parts_ + attn_parts_;
  part_ml_.resize(B_ * G * parts * (H / G) * 2);
  part_o_.resize(B_ * G * parts * (H / G) * dv);
}

void NsaDecodeCuda::step(const bf16* q, const bf16* const k[kNumBranches],
                         const bf16* const v[kNumBranches], const bf16* const gate[kNumBranches],
                         const int32_t* pos, bf16* o, cudaStream_t stream) {
  const NsaConfig& c = cfg_;
  DecodeParams p{};
  p.dims =
      dims_of(c, max_len_, max_cmp_, static_cast<int>(cmp_parts_), static_cast<int>(attn_parts_),
              static_cast<int>(sel_chunk_), static_cast<int>(sel_chunks_));
  p.dense = dense_;
  p.pos = pos;
  p.q = q;
  for (int br = 0; br < kNumBranches; ++br) {
    p.k_in[br] = k[c.kv_index(br)];
    p.v_in[br] = v[c.kv_index(br)];
    p.gate[br] = gate[br];
  }
  p.k_sel = k_sel_.get(), p.v_sel = v_sel_.get(), p.k_win = k_win_.get(), p.v_win = v_win_.get();
  p.k_raw = k_raw_.get(), p.v_raw = v_raw_.get(), p.k_cmp = k_cmp_.get(), p.v_cmp = v_cmp_.get();
  p.scores = scores_.get(), p.part_ml = part_ml_.get(), p.part_o = part_o_.get();
  p.cand = reinterpret_cast<Candidate*>(candidates_.get());
  p.sel = sel_.get();
  p.o = o;
  const int B = static_cast<int>(B_), G = p.dims.G;
  launch_dependent(append_kernel, dim3(B, G), dim3(kThreads), 0, stream, p);
  if (!dense_) {
    launch_dependent(cmp_parts_kernel, dim3(B * G, static_cast<unsigned>(cmp_parts_)),
                     dim3(kPartThreads), part_smem_bytes(kCmpPart, false), stream, p);
    launch_dependent(block_topk_kernel, dim3(B * G, static_cast<unsigned>(sel_chunks_)),
                     dim3(kTopkThreads), block_topk_smem_bytes(), stream, p);
  }
  const dim3 grid(B * G, static_cast<unsigned>(attn_parts_));
  if (dense_) {
    launch_dependent(attn_parts_kernel<kDensePart>, grid, dim3(kPartThreads),
                     part_smem_bytes(kDensePart, false), stream, p);
  } else {
    launch_dependent(attn_parts_kernel<kAttnPart>, grid, dim3(kPartThreads),
                     part_smem_bytes(kAttnPart, true), stream, p);
  }
  launch_dependent(combine_kernel, dim3(B, static_cast<unsigned>(c.heads)), dim3(kPartThreads), 0,
                   stream, p);
}

void NsaDecodeCuda::fill_random(int64_t len, uint64_t seed, cudaStream_t stream) {
  NSA_CHECK(len >= 0 && len <= max_len_, "decode: fill length ", len, " is outside [0, ", max_len_,
            "]");
  uint64_t s = seed;
  for (DeviceBuffer<bf16>* buf :
       {&k_sel_, &v_sel_, &k_win_, &v_win_, &k_raw_, &v_raw_, &k_cmp_, &v_cmp_}) {
    if (buf->size() == 0) continue;
    fill_random_kernel<<<1024, 256, 0, stream>>>(buf->get(), buf->size(), s += 0x1234567ull);
    NSA_CUDA_LAUNCH_CHECK();
  }
}

namespace {
__global__ void advance_kernel(int32_t* pos, int64_t n) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) pos[i] += 1;
}
}  // namespace

void launch_advance_positions(int32_t* pos, int64_t batch, cudaStream_t stream) {
  advance_kernel<<<static_cast<unsigned>((batch + 255) / 256), 256, 0, stream>>>(pos, batch);
  NSA_CUDA_LAUNCH_CHECK();
}

int64_t NsaDecodeCuda::kv_bytes_per_step(int64_t t) const {
  const NsaConfig& c = cfg_;
  int64_t tokens = t + 1;
  if (!dense_) {
    const int64_t blk = t / c.l_sel, chosen = std::min(c.n_sel, blk + 1);
    tokens = c.num_visible_compressed(t) + (chosen - 1) * c.l_sel + (t - blk * c.l_sel + 1) +
             std::min(c.w, t + 1);
  }
  return c.groups * tokens * (c.dk + c.dv) * static_cast<int64_t>(sizeof(bf16));
}

// Dynamic shared memory of a part kernel: its staged value rows, then (selected parts) the
// selection scratch.
size_t NsaDecodeCuda::part_smem_bytes(int part, bool selection) const {
  const int dv = static_cast<int>(cfg_.dv);
  return static_cast<size_t>(v_rows(part, dv) * dv) * sizeof(bf16) +
         (selection ? sizeof(SelectScratch) : 0);
}

// Block scores of a chunk, and the group probabilities of the compressed tokens that meet it.
size_t NsaDecodeCuda::block_topk_smem_bytes() const {
  const int64_t gp = (sel_chunk_ * cfg_.l_sel + cfg_.l) / cfg_.d + 2;
  return static_cast<size_t>(sel_chunk_ + gp) * sizeof(float);
}

size_t NsaDecodeCuda::bytes() const {
  return k_sel_.bytes() + v_sel_.bytes() + k_win_.bytes() + v_win_.bytes() + k_raw_.bytes() +
         v_raw_.bytes() + k_cmp_.bytes() + v_cmp_.bytes() + scores_.bytes() + part_ml_.bytes() +
         part_o_.bytes() + candidates_.bytes() + sel_.bytes();
}

}  // namespace nsa::cuda
