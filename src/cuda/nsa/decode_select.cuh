// Decode selection (docs/nsa.md, "Selection scores" and "Top-n"), split over CTAs: block_topk
// scores one chunk of candidate blocks of one (sequence, group) and keeps the chunk's best
// n_sel − forced in rank order; select_blocks merges the chunks' lists into the exact top-n (the
// union of the chunks' bests holds the global best). From every compressed score the arithmetic
// is the reference's order: the group probability of each compressed token (Σ over heads in head
// order of exp(s − M_h) times 1 / L_h, the head's merged max and the reciprocal of its sum – a
// rounding apart from the reference's division, so that only near ties can differ), then each
// block's Σ over tokens ascending of P[i]·overlap·(1/l); from the parts' block sums (m7c's shape:
// decode_params.cuh) the same terms summed over the tokens first, then the heads. Ties go to the
// lower block.
#pragma once

#include "common/fast_exp.cuh"
#include "common/mma.cuh"
#include "decode_merge.cuh"

namespace nsa::cuda::decode {

constexpr int kTopkThreads = 256, kTopkTokens = 2, kRankLanes = 4;

// Block scores and a partial top-n for chunk `chunk` of group-row bg: the candidate blocks
// [1 + chunk·sel_chunk, 1 + (chunk + 1)·sel_chunk) ∩ [1, c − 2], the chunk's best
// `free` = n_sel − forced by (score desc, index asc) in rank order into cand (the rest of its n_sel
// entries empty). `scores` is what the parts left: every compressed token's scaled scores, or with
// kSums the block sums (decode_params.cuh; at most kSumHeads heads). Latency: the chunk's scores
// (of its first kTopkTokens·blockDim tokens) or sums (of its first blockDim blocks, and its warps'
// maxes) and the statistics of the first kStatParts·32 compressed parts are loaded before the
// position, so all arrive in one round trip (those past the position's last token are then left
// out). smem: block keys [sel_chunk] (Candidate, two floats each), then the group probabilities of
// the tokens that meet the chunk, or with kSums the weights f of its warps. Every thread of the CTA
// calls it.
constexpr int kStatParts = 2;
constexpr int kStatHeads = (kMaxHeadsPerGroup + kTopkThreads / 32 - 1) / (kTopkThreads / 32);
constexpr int kSumHeads = 8;

// The warps whose tokens meet a chunk of sel_chunk blocks (4·j0 − 1 .. 4·(j0 + sel_chunk) − 1),
// the rows of its weights f in shared memory (kSumHeads floats each).
__host__ __device__ constexpr int sum_warps(int64_t sel_chunk) {
  return static_cast<int>(sel_chunk / 8 + 2);
}

// mark(k) records trace point k (decode_trace.cuh): 0 the statistics merged, 1 the probabilities
// (kSums: the weights) staged, 2 the blocks scored.
template <bool kSums, typename Mark>
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
  // A token past `last` is never staged (stage stops at gi1 ≤ last), so its loads only need a
  // valid address: the last token's, and no select per load.
  const auto load = [&](int i, int last, float* x) {
    const float* at = sc + min(i, last);
#pragma unroll
    for (int hh = 0; hh < kMaxHeadsPerGroup; ++hh) {
      if (hh >= m.hpg) break;
      x[hh] = at[static_cast<int64_t>(hh) * m.max_cmp];
    }
  };
  // kSums: block j's A and the B of quartet j − 1 per head, and entry i of the chunk's warp maxes
  // (warp w_lo + i / 8, head i mod 8); blocks and warps past the rows (the last chunk's tail, never
  // scored) load the rows' last.
  const int64_t row = block_sums_floats(m.sums_q);
  const float* sums = block_sums_row(m, scores, bg, 0);
  const int w_lo = (4 * j0 - 1) / 32, nf = sum_warps(m.sel_chunk) * kSumHeads;
  const auto load_sums = [&](int j, float* a, float* bq) {
    const int q = min(j, m.sums_q - 1);
#pragma unroll
    for (int hh = 0; hh < kSumHeads; ++hh) {
      if (hh >= m.hpg) break;
      a[hh] = sums[hh * row + q];
      bq[hh] = sums[hh * row + m.sums_q + q - 1];
    }
  };
  const auto load_warp_max = [&](int i) {
    const int h = i % kSumHeads, w = min(w_lo + i / kSumHeads, m.sums_q / 8 - 1);
    return h < m.hpg ? sums[h * row + 2 * m.sums_q + w] : -FLT_MAX;
  };
  float x[kTopkTokens][kMaxHeadsPerGroup];
  float a[kSumHeads], bq[kSumHeads], wmax = -FLT_MAX;
  if constexpr (kSums) {
    if (threadIdx.x < m.sel_chunk) load_sums(j0 + threadIdx.x, a, bq);
    if (threadIdx.x < nf) wmax = load_warp_max(threadIdx.x);
  } else {
    // Tokens past the chunk's last (gi_max: known before the position) are not loaded – a chunk
    // of 64 blocks meets 257 tokens, so 255 threads of a CTA would load the last one's scores
    // again.
#pragma unroll
    for (int k = 0; k < kTopkTokens; ++k) {
      const int i = gi0 + threadIdx.x + k * blockDim.x;
      if (k == 0 || i <= gi_max) load(i, gi_max, x[k]);
    }
  }
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
  const int stride = candidate_stride(m.n_sel);
  Candidate* out = cand + (static_cast<int64_t>(bg) * m.sel_chunks + chunk) * stride;
  for (int k = threadIdx.x; k < stride; k += blockDim.x) out[k] = kNoCandidate;  // and the pad
  const int j1 = min(j0 + m.sel_chunk, c - 1);                                   // [j0, j1)
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
  // The group probabilities of the chunk's compressed tokens, or (kSums) the weights of its warps,
  // staged in shared memory after the blocks' keys (8-byte keys: the kernel declares its dynamic
  // shared memory 16-byte aligned).
  Candidate* block_key = reinterpret_cast<Candidate*>(smem);
  float* gp = smem + 2 * m.sel_chunk;
  if constexpr (kSums) {
    // f_h(w) = exp(m_w − M_h) / L_h at gp[8·(w − w_lo) + h]; a block's score is
    // Σ_h A_j·f_h(w(4j)) + B_(j−1)·f_h(w(4j − 1)), heads ascending.
    const auto weight = [&](int i, float wm) {
      const int h = i % kSumHeads;
      gp[i] = h < m.hpg ? fast_exp(wm - head_max[h]) * head_inv_sum[h] : 0.0f;
    };
    if (threadIdx.x < nf) weight(threadIdx.x, wmax);
    for (int i = threadIdx.x + blockDim.x; i < nf; i += blockDim.x) weight(i, load_warp_max(i));
    __syncthreads();
    mark(1);
    for (int j = j0 + threadIdx.x, k = 0; j < j1; j += blockDim.x, ++k) {
      if (k > 0) load_sums(j, a, bq);
      const float* fa = gp + kSumHeads * ((4 * j) / 32 - w_lo);
      const float* fb = gp + kSumHeads * ((4 * j - 1) / 32 - w_lo);
      float score = 0.0f;
#pragma unroll
      for (int hh = 0; hh < kSumHeads; ++hh) {
        if (hh >= m.hpg) break;
        score = fmaf(a[hh], fa[hh], score);
        score = fmaf(bq[hh], fb[hh], score);
      }
      block_key[j - j0] = candidate_key(score, j);
    }
  } else {
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
      block_key[j - j0] = candidate_key(score, j);  // (score desc, block asc) as one unsigned order
    }
  }
  __syncthreads();
  mark(2);
  // Each block's rank in the chunk: kRankLanes adjacent lanes count a share of the blocks that
  // beat it each – one 64-bit compare of keys (independent loads, no early exit) – summed by
  // shuffles. At B = 16 the kernel is bound by issued instructions, and this loop was a fifth of
  // them as a float compare with an index tie-break (docs/perf.md).
  const int q = threadIdx.x % kRankLanes, per_round = blockDim.x / kRankLanes;
  for (int base = j0; base < j1; base += per_round) {  // uniform over the CTA
    const int j = base + threadIdx.x / kRankLanes;
    const Candidate kj = j < j1 ? block_key[j - j0] : kNoCandidate;
    int rank = 0;
    if (j < j1) {
#pragma unroll 4
      for (int k = j0 + q; k < j1; k += kRankLanes) rank += block_key[k - j0] > kj ? 1 : 0;
    }
    for (int off = kRankLanes / 2; off > 0; off >>= 1)
      rank += __shfl_xor_sync(0xffffffffu, rank, off);
    if (j < j1 && q == 0 && rank < free) out[rank] = kj;
  }
}

// Shared memory of select_blocks, carved after the picks kernel's tile: the chunks' lists
// (sel_chunks × candidate_stride(n_sel) candidates, as in global memory), the candidates kept for
// ranking (at most sel_chunks × n_sel) and θ's sample (32). The loops load
// kSelectBatch entries before they compare any (a loop that compared each load first waited a
// shared-memory latency per entry: nsa_decode_select), so the arrays end kSelectBatch entries
// of slack past their counts, and each starts 16-byte aligned for the paired loads.
constexpr int kSelectBatch = 8;

struct SelectScratch {
  Candidate *cand, *kept, *sample;
};

// Offsets (in candidates) of the scratch's arrays, and its bytes: one layout for the host's size
// and the kernel's carving.
struct SelectLayout {
  int64_t kept, sample, bytes;
};

__host__ __device__ constexpr SelectLayout select_layout(int64_t sel_chunks, int64_t n_sel) {
  const auto even = [](int64_t n) { return (n + 1) / 2 * 2; };  // 16-byte steps
  const int64_t kept = even(candidate_keys(sel_chunks, n_sel) + kSelectBatch);
  const int64_t sample = kept + even(sel_chunks * n_sel + kSelectBatch);
  return {kept, sample, (sample + 32) * static_cast<int64_t>(sizeof(Candidate))};
}

__host__ __device__ constexpr size_t select_scratch_bytes(int64_t sel_chunks, int64_t n_sel) {
  return static_cast<size_t>(select_layout(sel_chunks, n_sel).bytes);
}

__device__ __forceinline__ SelectScratch carve_select(unsigned char* base, const DecodeDims& m) {
  const SelectLayout at = select_layout(m.sel_chunks, m.n_sel);
  SelectScratch s;
  s.cand = reinterpret_cast<Candidate*>(base);
  s.kept = s.cand + at.kept;
  s.sample = s.cand + at.sample;
  return s;
}
static_assert(kMaxTopkChunks <= 32, "select_blocks takes a lane per chunk list");

__device__ __forceinline__ bool beats(Candidate a, Candidate b) {
  return a > b;
}

// How many of the candidates a[0, n) beat y (a 16-byte aligned, readable to n rounded up to
// kSelectBatch): kSelectBatch at a time, all loaded (paired) before any is compared. Every lane
// reads the same entries (broadcasts).
__device__ __forceinline__ int count_beating(const Candidate* a, int n, Candidate y) {
  int count = 0;
  for (int u0 = 0; u0 < n; u0 += kSelectBatch) {
    ulonglong2 v[kSelectBatch / 2];
#pragma unroll
    for (int i = 0; i < kSelectBatch / 2; ++i)
      v[i] = reinterpret_cast<const ulonglong2*>(a + u0)[i];
#pragma unroll
    for (int i = 0; i < kSelectBatch / 2; ++i) {
      count += u0 + 2 * i < n && beats(v[i].x, y) ? 1 : 0;
      count += u0 + 2 * i + 1 < n && beats(v[i].y, y) ? 1 : 0;
    }
  }
  return count;
}

// How many of the distinct blocks a[0, n) lie below v (a 16-byte aligned, readable to n rounded
// up to kSelectBatch).
__device__ __forceinline__ int count_below(const int* a, int n, int v) {
  int count = 0;
  for (int q0 = 0; q0 < n; q0 += kSelectBatch) {
    int4 w[kSelectBatch / 4];
#pragma unroll
    for (int i = 0; i < kSelectBatch / 4; ++i) w[i] = reinterpret_cast<const int4*>(a + q0)[i];
#pragma unroll
    for (int i = 0; i < kSelectBatch / 4; ++i) {
      const int q = q0 + 4 * i;
      count += (q < n && w[i].x < v) + (q + 1 < n && w[i].y < v) + (q + 2 < n && w[i].z < v) +
               (q + 3 < n && w[i].w < v);
    }
  }
  return count;
}

// Starts copying every chunk's candidate list of group-row bg into sh.cand (the chunks that hold
// candidates at this step's position are a prefix; the position is not needed yet).
__device__ __forceinline__ void issue_candidates(const DecodeDims& m, const Candidate* cand, int bg,
                                                 const SelectScratch& sh) {
  const int lists = static_cast<int>(candidate_keys(m.sel_chunks, m.n_sel));
  const int* in = reinterpret_cast<const int*>(cand + static_cast<int64_t>(bg) * lists);
  int* out = reinterpret_cast<int*>(sh.cand);
  for (int i = threadIdx.x; i < 2 * lists; i += blockDim.x) cp_async<4>(out + i, in + i);
}

// What the selection at position t needs besides the candidates – known before they land, so
// that the picks kernel works it out while it waits for the top-n kernel: c = ⌊t / l_sel⌋, the
// forced blocks' count, the picks' count (the candidates are blocks 1 .. c − 2), the chunks that
// hold candidates (a prefix), the entries of a list that can matter, and the sample entry of this
// lane (entry idx of list lane − idx·chunks; see select_blocks).
struct SelectPlan {
  int t, forced, npicks, chunks, span, idx;
};

__device__ __forceinline__ SelectPlan select_plan(const DecodeDims& m, int t) {
  SelectPlan s;
  const int c = m.div_lsel.div(t);
  s.t = t;
  s.forced = num_forced(m, t);
  s.npicks = max(0, min(c - 2, m.n_sel - s.forced));
  s.chunks = min(m.sel_chunks, (max(0, c - 2) + m.sel_chunk - 1) / m.sel_chunk);
  s.span = min(m.n_sel, s.npicks);  // only a list's first npicks entries can be picked
  // lane / chunks without a division: (lane + ½) / chunks is at least 1/64 from an integer.
  const float lane = static_cast<float>(threadIdx.x % 32) + 0.5f;
  s.idx = s.chunks > 0 ? static_cast<int>(lane * __frcp_rn(static_cast<float>(s.chunks))) : 0;
  return s;
}

// Bits of a list's kept count (at most n_sel ≤ kMaxSel) for the prefix sum by ballots.
constexpr int kKeptBits = 7;
static_assert(kMaxSel < (1 << kKeptBits), "a list's kept count must fit kKeptBits bits");
static_assert(kMaxSel % kSelectBatch == 0, "write_selection reads picks[] in whole batches");

// The picks of plan s from the candidate lists in sh.cand (landed, after a barrier), best first,
// into picks[]; returns their number. The attention takes them in any order (only t's block c,
// a forced one, is short, and picks lie below c − 1); write_selection puts them in ascending order
// later, off the way to the attention. The picks are the best npicks of the chunks' candidates by
// (score desc, index asc) – a strict order (blocks are distinct), and the global best are among the
// chunks' bests. Each list is sorted in that order with its empty entries last. Pruned before
// ranking by θ, a candidate that at least npicks candidates beat or equal, so that no candidate
// worse than θ is picked and whatever beats a kept candidate is kept too: a kept candidate's rank
// among the kept (a count over them) is its global rank. θ is the better of two such bounds: the
// best of the lists' entries npicks − 1 (that list's first npicks are not worse), and the npicks-th
// best of 32 of the best candidates (the lists' first entries, round robin) – the second keeps
// about npicks + 3 of ~220 candidates on random scores at 64k. One warp does it all (the others
// wait at the one barrier at the end): reductions, ballots, shuffles and independent loads, no
// barrier between the loops, the kept candidates placed by a prefix sum instead of atomics –
// deterministic in where each lands. picks is shared memory; every thread of the CTA calls it.
// mark(k) records a phase's end on the warp's first lane (the kernel workshop,
// bench/kernels/decode_select.cu): 0 θ and the kept counts, 1 the kept candidates placed, 2 ranked.
template <typename Mark>
__device__ int select_blocks(const DecodeDims& m, const SelectPlan& s, const SelectScratch& sh,
                             int* picks, Mark&& mark) {
  if (threadIdx.x < 32) {
    const unsigned all = 0xffffffffu;
    const int lane = threadIdx.x, stride = candidate_stride(m.n_sel);
    const Candidate empty = kNoCandidate;
    const auto entry = [&](int list, int idx) { return sh.cand[list * stride + idx]; };
    int kept_here = 0;  // how many of list `lane`'s first entries are kept (a prefix)
    if (s.span > 0) {   // (span > 0: chunks ≥ 1)
      // θ's first bound, a lane per list (a 64-bit maximum as two 32-bit reductions), and the
      // sample: entry k = idx·chunks + list < 32 (entry idx of list `list`), lane k's own.
      const Candidate last = lane < s.chunks ? entry(lane, s.span - 1) : empty;
      const Candidate x = s.idx < s.span ? entry(lane - s.idx * s.chunks, s.idx) : empty;
      const uint32_t hi = __reduce_max_sync(all, static_cast<uint32_t>(last >> 32));
      const uint32_t lo = __reduce_max_sync(
          all, static_cast<uint32_t>(last >> 32) == hi ? static_cast<uint32_t>(last) : 0u);
      Candidate theta = (static_cast<Candidate>(hi) << 32) | lo;
      sh.sample[lane] = x;
      __syncwarp();
      const int beaten_by = count_beating(sh.sample, 32, x);
      const unsigned at = __ballot_sync(all, x != kNoCandidate && beaten_by == s.npicks - 1);
      if (at != 0) {  // the sample's npicks-th best (real candidates are distinct)
        const Candidate s2 = __shfl_sync(all, x, __ffs(at) - 1);
        if (beats(s2, theta)) theta = s2;
      }
      // Each list's kept entries are a prefix (sorted, empties last): count them, a batch of
      // loads at a time.
      if (lane < s.chunks) {
        for (int i0 = 0; i0 < s.span; i0 += kSelectBatch) {
          Candidate v[kSelectBatch];
#pragma unroll
          for (int i = 0; i < kSelectBatch; ++i) v[i] = entry(lane, i0 + i);
#pragma unroll
          for (int i = 0; i < kSelectBatch; ++i)
            kept_here += i0 + i < s.span && v[i] != kNoCandidate && !beats(theta, v[i]) ? 1 : 0;
        }
      }
    }
    mark(0);
    // The kept candidates side by side: list `lane`'s at its exclusive prefix sum over the lanes,
    // summed a bit at a time by ballots (independent, where shuffles would be five steps in turn).
    int start = 0, kept = 0;
    const unsigned lower = (1u << lane) - 1u;
#pragma unroll
    for (int bit = 0; bit < kKeptBits; ++bit) {
      const unsigned v = __ballot_sync(all, (kept_here >> bit) & 1);
      start += __popc(v & lower) << bit;
      kept += __popc(v) << bit;
    }
    for (int i0 = 0; i0 < kept_here; i0 += kSelectBatch) {
      Candidate v[kSelectBatch];
#pragma unroll
      for (int i = 0; i < kSelectBatch; ++i) v[i] = entry(lane, i0 + i);
#pragma unroll
      for (int i = 0; i < kSelectBatch; ++i) {
        if (i0 + i < kept_here) sh.kept[start + i0 + i] = v[i];
      }
    }
    __syncwarp();
    mark(1);
    // A kept candidate's rank: the kept that beat it; the picks in rank order.
    for (int k = lane; k < kept; k += 32) {
      const Candidate y = sh.kept[k];
      const int rank = count_beating(sh.kept, kept, y);
      if (rank < s.npicks) picks[rank] = candidate_block(y);
    }
    mark(2);
  }
  __syncthreads();
  return s.npicks;
}

// The selection of plan s ascending into out[0, n_sel) – block 0, the picks (picks[0, npicks),
// shared memory, 16-byte aligned and readable to kMaxSel), then the other forced blocks c − 1, c
// (the candidates lie between), −1 past those – by one warp: a pick's place is the count of picks
// below it (all distinct), so places are filled once each.
__device__ __forceinline__ void write_selection(const DecodeDims& m, const SelectPlan& s,
                                                const int* picks, int* out) {
  const int lane = threadIdx.x % 32;
  for (int k = lane; k < s.npicks; k += 32) {
    const int v = picks[k];
    out[1 + count_below(picks, s.npicks, v)] = v;
  }
  if (lane == 0) out[0] = 0;
  if (lane >= 1 && lane < s.forced) out[s.npicks + lane] = forced_block(m, s.t, lane);
  for (int k = s.forced + s.npicks + lane; k < m.n_sel; k += 32) out[k] = -1;
}

}  // namespace nsa::cuda::decode
