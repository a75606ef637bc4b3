// Decode selection (docs/nsa.md, "Selection scores" and "Top-n"), split over CTAs: block_topk
// scores one chunk of candidate blocks of one (sequence, group) and keeps the chunk's best
// n_sel − forced in rank order; select_blocks merges the chunks' lists into the exact top-n (the
// union of the chunks' bests holds the global best). The arithmetic is the reference's order:
// the group probability of each compressed token (Σ over heads in head order of exp(s − M_h)
// times 1 / L_h, the head's merged max and the reciprocal of its sum – a rounding apart from the
// reference's division, so that only near ties can differ), then each block's Σ over tokens
// ascending of P[i]·overlap·(1/l); ties go to the lower block.
#pragma once

#include "common/fast_exp.cuh"
#include "common/mma.cuh"
#include "decode_merge.cuh"

namespace nsa::cuda::decode {

constexpr int kTopkThreads = 256, kTopkTokens = 2, kTopkChunk = 64, kRankLanes = 4;

// Block scores and a partial top-n for chunk `chunk` of group-row bg: the candidate blocks
// [1 + chunk·sel_chunk, 1 + (chunk + 1)·sel_chunk) ∩ [1, c − 2], the chunk's best
// `free` = n_sel − forced by (score desc, index asc) in rank order into cand (the rest of its n_sel
// entries empty). Latency: the scores of the chunk's first kTopkTokens·blockDim tokens and the
// statistics of the first kStatParts·32 compressed parts are loaded before the position, so all
// arrive in one round trip (those past the position's last token are then left out). smem: block
// scores [sel_chunk], then the group probabilities of the tokens that meet the chunk. Every thread
// of the CTA calls it.
constexpr int kStatParts = 2;
constexpr int kStatHeads = (kMaxHeadsPerGroup + kTopkThreads / 32 - 1) / (kTopkThreads / 32);

// mark(k) records trace point k (decode_trace.cuh): 0 the statistics merged, 1 the probabilities
// staged, 2 the blocks scored.
template <typename Mark>
__device__ void block_topk(const DecodeDims& m, const int32_t* pos, int b, int bg, int chunk,
                           const float* scores, const float* part_ml, Candidate* cand, float* smem,
                           Mark&& mark) {
  __shared__ float head_max[kMaxHeadsPerGroup], head_inv_sum[kMaxHeadsPerGroup];
  // Compressed tokens i whose raw range [i·d, i·d + l) meets block j: [i_lo(j), i_hi(j)] (i_hi
  // before the clamp to the last token).
  const auto i_lo = [&m](int j) {
    const int lo_num = j * m.l_sel - m.l + 1;
    return lo_num <= 0 ? 0 : m.div_d.div(lo_num + m.d - 1);
  };
  const auto i_end = [&m](int j) { return m.div_d.div((j + 1) * m.l_sel - 1); };
  const int j0 = 1 + chunk * m.sel_chunk;
  const int gi0 = i_lo(j0);
  const int gi_max = min(static_cast<int>(m.max_cmp) - 1, i_end(j0 + m.sel_chunk - 1));
  const float* sc = scores + static_cast<int64_t>(bg) * m.hpg * m.max_cmp;
  // Every head's score of token i (independent loads, issued together; the loops over the heads
  // stop at hpg – a uniform branch – so that a group of 6 runs 6 iterations' instructions, not 16:
  // at one warp per scheduler every instruction costs its latency).
  const auto load = [&](int i, int last, float* x) {
#pragma unroll
    for (int hh = 0; hh < kMaxHeadsPerGroup; ++hh) {
      if (hh >= m.hpg) break;
      x[hh] = i <= last ? sc[static_cast<int64_t>(hh) * m.max_cmp + i] : 0.0f;
    }
  };
  float x[kTopkTokens][kMaxHeadsPerGroup];
#pragma unroll
  for (int k = 0; k < kTopkTokens; ++k) load(gi0 + threadIdx.x + k * blockDim.x, gi_max, x[k]);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, nw = blockDim.x / 32;
  float2 st[kStatHeads][kStatParts];
#pragma unroll
  for (int hi = 0; hi < kStatHeads; ++hi) {
#pragma unroll
    for (int i = 0; i < kStatParts; ++i) {
      const int h = warp + hi * nw, p = lane + 32 * i;
      st[hi][i] = h < m.hpg && p < m.cmp_parts ? load_ml(m, part_ml, bg, p, h)
                                               : make_float2(-FLT_MAX, 0.0f);
    }
  }
  const int t = pos[b];
  const int n = num_cmp(m, t), parts = (n + kPartKeys - 1) / kPartKeys;
  const int c = m.div_lsel.div(t), forced = num_forced(m, t), free = m.n_sel - forced;
  Candidate* out = cand + (static_cast<int64_t>(bg) * m.sel_chunks + chunk) * m.n_sel;
  for (int k = threadIdx.x; k < m.n_sel; k += blockDim.x) out[k] = kNoCandidate;
  const int j1 = min(j0 + m.sel_chunk, c - 1);  // [j0, j1)
  if (j0 >= j1 || free <= 0) return;
  const int gi1 = min(n - 1, i_end(j1 - 1));
#pragma unroll
  for (int hi = 0; hi < kStatHeads; ++hi) {
    const int h = warp + hi * nw;
    if (h >= m.hpg) break;  // warp-uniform
    float mx = -FLT_MAX, sum = 0.0f;
#pragma unroll
    for (int i = 0; i < kStatParts; ++i) {
      if (lane + 32 * i < parts) fold_stats(mx, sum, st[hi][i].x, st[hi][i].y);
    }
    fold_slots(m, part_ml, bg, h, 0, parts, lane + 32 * kStatParts, 32, mx, sum);
    warp_fold(mx, sum);
    if (lane == 0) {
      head_max[h] = mx;
      head_inv_sum[h] = 1.0f / sum;
    }
  }
  __syncthreads();
  mark(0);
  // The group probabilities of the chunk's compressed tokens, staged in shared memory.
  float* block_score = smem;
  float* gp = smem + m.sel_chunk;
  const auto stage = [&](int i, const float* xi) {
    if (i > gi1) return;
    float p = 0.0f;
#pragma unroll
    for (int hh = 0; hh < kMaxHeadsPerGroup; ++hh) {
      if (hh >= m.hpg) break;
      p += fast_exp(xi[hh] - head_max[hh]) * head_inv_sum[hh];
    }
    gp[i - gi0] = p;
  };
#pragma unroll
  for (int k = 0; k < kTopkTokens; ++k) stage(gi0 + threadIdx.x + k * blockDim.x, x[k]);
  for (int i = gi0 + threadIdx.x + kTopkTokens * blockDim.x; i <= gi1; i += blockDim.x) {
    load(i, gi1, x[0]);
    stage(i, x[0]);
  }
  __syncthreads();
  mark(1);
  const float inv_l = 1.0f / static_cast<float>(m.l);
  for (int j = j0 + threadIdx.x; j < j1; j += blockDim.x) {
    float score = 0.0f;  // ascending over the compressed tokens
    for (int i = i_lo(j), hi = min(n - 1, i_end(j)); i <= hi; ++i) {
      const int overlap = min(i * m.d + m.l, (j + 1) * m.l_sel) - max(i * m.d, j * m.l_sel);
      score += gp[i - gi0] * static_cast<float>(overlap) * inv_l;
    }
    block_score[j - j0] = score;
  }
  __syncthreads();
  mark(2);
  // Each block's rank in the chunk: kRankLanes adjacent lanes count a share of the blocks that
  // beat it each (independent loads, no early exit), summed by shuffles.
  const int q = threadIdx.x % kRankLanes, per_round = blockDim.x / kRankLanes;
  for (int base = j0; base < j1; base += per_round) {  // uniform over the CTA
    const int j = base + threadIdx.x / kRankLanes;
    const float sj = j < j1 ? block_score[j - j0] : 0.0f;
    int rank = 0;
    if (j < j1) {
#pragma unroll 4
      for (int k = j0 + q; k < j1; k += kRankLanes) {
        const float sk = block_score[k - j0];
        rank += (sk > sj || (sk == sj && k < j)) ? 1 : 0;
      }
    }
    for (int off = kRankLanes / 2; off > 0; off >>= 1)
      rank += __shfl_xor_sync(0xffffffffu, rank, off);
    if (j < j1 && q == 0 && rank < free) out[rank] = candidate_key(sj, j);
  }
}

// Shared memory of select_blocks, carved after the picks kernel's tile: the chunks' lists
// (sel_chunks × n_sel candidates), the candidates kept for ranking (at most as many) and the
// selection's list.
struct SelectScratch {
  Candidate *cand, *kept;
  int* list;  // [kMaxSel]
};

__host__ __device__ constexpr size_t select_scratch_bytes(int64_t sel_chunks, int64_t n_sel) {
  return 2 * static_cast<size_t>(sel_chunks * n_sel) * sizeof(Candidate) + kMaxSel * sizeof(int);
}

__device__ __forceinline__ SelectScratch carve_select(unsigned char* base, const DecodeDims& m) {
  SelectScratch s;
  const int n = m.sel_chunks * m.n_sel;
  s.cand = reinterpret_cast<Candidate*>(base);
  s.kept = s.cand + n;
  s.list = reinterpret_cast<int*>(s.kept + n);
  return s;
}
static_assert(kMaxTopkChunks <= 32, "select_blocks takes a lane per chunk list");

__device__ __forceinline__ bool beats(Candidate a, Candidate b) {
  return a > b;
}

// Starts copying every chunk's candidate list of group-row bg into sh.cand (the chunks that hold
// candidates at this step's position are a prefix; the position is not needed yet).
__device__ __forceinline__ void issue_candidates(const DecodeDims& m, const Candidate* cand, int bg,
                                                 const SelectScratch& sh) {
  const int* in =
      reinterpret_cast<const int*>(cand + static_cast<int64_t>(bg) * m.sel_chunks * m.n_sel);
  int* out = reinterpret_cast<int*>(sh.cand);
  for (int i = threadIdx.x; i < 2 * m.sel_chunks * m.n_sel; i += blockDim.x)
    cp_async4(out + i, in + i);
}

// The selection at position t from the candidate lists in sh.cand (landed, after a barrier): all
// selected blocks ascending, −1 padded, into slot[0, n_sel), and the picked (non-forced) ones
// ascending into picks[]; returns their number. Forced 0, c − 1, c; then the best npicks of the
// chunks' candidates by (score desc, index asc) – a strict order (blocks are distinct), and the
// global best are among the chunks' bests. Each list is sorted in that order with its empty
// entries last. Pruned before ranking by θ, a candidate that at least npicks candidates beat or
// equal, so that no candidate worse than θ is picked and whatever beats a kept candidate is kept
// too: a kept candidate's rank among the kept (a count over them) is its global rank. θ is the
// better of two such bounds: the best of the lists' entries npicks − 1 (that list's first npicks
// are not worse), and the npicks-th best of 32 of the best candidates (the lists' first entries,
// round robin) – the second keeps about npicks + 3 of ~220 candidates on random scores at 64k.
// One warp does it all (the others wait at the one barrier at the end): shuffles and independent
// loads, no barrier between the loops, the kept candidates placed by a prefix sum instead of
// atomics – no faster in the step than the CTA-wide version it replaced (docs/perf.md), but
// shorter, and deterministic in where each kept candidate lands. slot and picks are shared
// memory; every thread of the CTA calls it.
__device__ int select_blocks(const DecodeDims& m, int t, const SelectScratch& sh, int* slot,
                             int* picks) {
  const int c = m.div_lsel.div(t), forced = num_forced(m, t), free = m.n_sel - forced;
  const int chunks = min(m.sel_chunks, (max(0, c - 2) + m.sel_chunk - 1) / m.sel_chunk);
  const int npicks = max(0, min(c - 2, free));
  if (threadIdx.x < 32) {
    const unsigned all = 0xffffffffu;
    const int lane = threadIdx.x;
    if (lane < forced) sh.list[lane] = forced_block(m, t, lane);
    // Only a list's first npicks entries can be picked, or beat a pick.
    const int span = min(m.n_sel, npicks);
    const Candidate empty = kNoCandidate;
    const auto entry = [&](int list, int idx) { return sh.cand[list * m.n_sel + idx]; };
    Candidate theta = empty;  // empty: every candidate is kept
    int kept_here = 0;        // how many of list `lane`'s first entries are kept (a prefix)
    if (span > 0) {           // (span > 0: chunks ≥ 1)
      // θ's first bound, a lane per list, and the sample: entry k = idx·chunks + list < 32
      // (entry idx of list `list`), lane k's own.
      Candidate last = lane < chunks ? entry(lane, span - 1) : empty;
      const int idx = lane / chunks;
      const Candidate x = idx < span ? entry(lane - idx * chunks, idx) : empty;
      int beaten_by = 0;
#pragma unroll
      for (int r = 0; r < 32; ++r) beaten_by += beats(__shfl_sync(all, x, r), x) ? 1 : 0;
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) {
        const Candidate o = __shfl_xor_sync(all, last, off);
        if (beats(o, last)) last = o;
      }
      theta = last;
      const unsigned at = __ballot_sync(all, x != kNoCandidate && beaten_by == npicks - 1);
      if (at != 0) {  // the sample's npicks-th best (real candidates are distinct)
        const Candidate s2 = __shfl_sync(all, x, __ffs(at) - 1);
        if (beats(s2, theta)) theta = s2;
      }
      // Each list's kept entries are a prefix (sorted, empties last): count them, independent
      // loads.
      if (lane < chunks) {
#pragma unroll 4
        for (int i = 0; i < span; ++i) {
          const Candidate y = entry(lane, i);
          kept_here += y != kNoCandidate && !beats(theta, y) ? 1 : 0;
        }
      }
    }
    // The kept candidates side by side: list `lane`'s at its exclusive prefix sum over the lanes.
    int end = kept_here;
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
      const int o = __shfl_up_sync(all, end, off);
      if (lane >= off) end += o;
    }
    const int kept = __shfl_sync(all, end, 31);
    for (int i = 0; i < kept_here; ++i) sh.kept[end - kept_here + i] = entry(lane, i);
    __syncwarp();
    // A kept candidate's rank: the kept that beat it.
    for (int k = lane; k < kept; k += 32) {
      const Candidate y = sh.kept[k];
      int rank = 0;
#pragma unroll 8
      for (int u = 0; u < kept; ++u) rank += beats(sh.kept[u], y) ? 1 : 0;
      if (rank < npicks) sh.list[forced + rank] = candidate_block(y);
    }
    __syncwarp();
    // The selection ascending: entry k's place is the count of entries below it (all distinct), so
    // places 0 .. total − 1 are filled once each and the rest padded in the same pass.
    const int total = forced + npicks;
    for (int k = total + lane; k < m.n_sel; k += 32) slot[k] = -1;
    for (int k = lane; k < total; k += 32) {
      const int v = sh.list[k];
      int at = 0, at_pick = 0;
#pragma unroll 8
      for (int q = 0; q < total; ++q) {
        const bool below = sh.list[q] < v;
        at += below ? 1 : 0;
        at_pick += below && q >= forced ? 1 : 0;
      }
      if (at < m.n_sel) slot[at] = v;
      if (k >= forced) picks[at_pick] = v;
    }
  }
  __syncthreads();
  return npicks;
}

}  // namespace nsa::cuda::decode
