// The sizes and the one parameter struct of the NSA decode kernels (nsa_decode.cu), and the layout
// of the partial results they hand each other (docs/inference.md, "Decoding on the GPU").
//
// Every kernel works on "parts": up to kPartKeys keys of one (sequence, group), attended by one CTA
// for the group's hpg heads at once (the MMA rows), leaving a partial softmax (max m, sum of exp l,
// unnormalised output o) per head in a slot of part_ml / part_o. Slots of one (sequence, group):
//   [0, cmp_parts)                 compressed parts (keys i·kPartKeys ..), scores kept
//   [slot_win, + win_parts)        window parts (ring slots k·kPartKeys ..)
//   [slot_block0, + block0_parts)  the forced block 0 (its first keys do not depend on t)
//   [slot_pre, + kNumBranches)     per branch r, slot_pre + r: the top-n kernel's merge of the
//                                  parts above – every compressed part, the window, block 0
// (dense decoding: [0, dense_parts), positions k·kPartKeys ..). The parts kernel takes the parts
// whose rows do not depend on the position (compressed, window, block 0, dense), so it issues
// their loads before it reads the position; the picks kernel the rest – the forced blocks c − 1
// and c (late parts) and the picked blocks – whose partials stay in its CTAs' shared memory and
// meet there, across the cluster.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "common/fast_div.h"
#include "decode_chunks.h"
#include "nsa/attention.h"

namespace nsa::cuda::decode {

// x rounded up to a multiple of 16: rows of 16-row MMA tiles, and 16-byte aligned shared-memory
// carves (int or size_t).
template <typename T>
__host__ __device__ constexpr T round16(T x) {
  return (x + 15) / 16 * 16;
}

using bf16 = __nv_bfloat16;

constexpr int kMaxHeadsPerGroup = 16;  // the rows of one m16n8k16 tile
constexpr int kPartKeys = 128;         // keys per part CTA
constexpr int kPartThreads = 128;      // four warps per part CTA
constexpr int kMaxSel = 64;            // n_sel limit of the candidate merge (plus forced slack)
constexpr int kPicksCluster = 8;       // picks CTAs per (sequence, group), at most: one cluster
// Phase timestamps (decode_trace.cuh): the kernels, in step order, and the points of each.
enum TraceKernel { kTraceParts, kTraceTopk, kTracePicks, kTraceKernels };
constexpr int kTracePhases = 8;

// Sizes of one decoder (int: head dims, block sizes and part counts are small; row offsets are
// computed in 64 bits where they multiply).
struct DecodeDims {
  int G, hpg, dk, dv, l, d, l_sel, n_sel, w;
  // The block sums' quartets per (sequence, group, head) row, 0 where the parts leave every
  // compressed score instead (block_sums_row); in the 4 bytes before the 8-byte fields.
  int sums_q;
  int64_t max_len, max_cmp;
  // Selected parts: keys per segment (one block, or a kPartKeys slice of a long block), blocks per
  // part (kPartKeys / l_sel, at least 1) and parts per block (⌈l_sel / kPartKeys⌉).
  int seg_len, bpp, sub;
  int cmp_parts, win_parts, block0_parts, late_parts, pick_parts, dense_parts;
  int slot_win, slot_block0, slot_pre, slots;
  int sel_chunk, sel_chunks;  // candidate blocks per block top-n CTA, CTAs per (sequence, group)
  float scale;
  // Division by d, l_sel, seg_len, l and w without a division instruction (common/fast_div.h).
  FastDiv div_d, div_lsel, div_seg, div_l, div_w, div_g;  // div_g: by G, for a CTA's (b, g)
};

// A candidate block of the top-n as one 64-bit key: its score's bits over the complement of its
// index, so that a larger key is a higher score, or the lower block on a tie (scores are ≥ 0,
// whose bits order as the floats); 0 is an empty slot, below every candidate. One unsigned
// compare ranks two candidates – the ranking loops are latency-bound at batch 1.
using Candidate = uint64_t;
constexpr Candidate kNoCandidate = 0;

__device__ __forceinline__ Candidate candidate_key(float score, int block) {
  return (static_cast<uint64_t>(__float_as_uint(score)) << 32) | static_cast<uint32_t>(~block);
}
__device__ __forceinline__ int candidate_block(Candidate key) {
  return static_cast<int>(~static_cast<uint32_t>(key));
}
// Candidates between the starts of two chunks' lists (n_sel entries, then a pad to an odd count):
// the picks CTA's warp reads entry i of every list at once, and 8-byte entries an odd count apart
// fall into different banks – n_sel = 16 apart, 16 lists were one bank's 16-way conflict.
__host__ __device__ constexpr int candidate_stride(int n_sel) {
  return n_sel | 1;
}
// The keys of one (sequence, group)'s candidate lists, pads included.
__host__ __device__ constexpr int64_t candidate_keys(int64_t sel_chunks, int64_t n_sel) {
  return sel_chunks * candidate_stride(static_cast<int>(n_sel));
}

// The one parameter struct every decode kernel takes (as NsaParams for the training kernels):
// the sizes, the step's inputs and outputs, the caches and the scratch between the kernels.
// Caches are [B, G, rows, dk|dv] (bf16); the dense baseline leaves the NSA-only ones null.
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
  // Scratch: what the compressed parts leave the top-n – their scaled scores [B, H, max_cmp], or
  // with dims.sums_q > 0 the block sums' rows [B·G, hpg, block_sums_floats] (block_sums_row);
  // partials [B·G, slots, hpg, 2 | dv]; block candidates [B·G, sel_chunks,
  // candidate_stride(n_sel)].
  float *scores, *part_ml, *part_o;
  Candidate* cand;
  // Whether the picks kernel runs its selection once before its wait, on empty lists (a dry pass
  // that warms its code; nsa_decode.cu).
  bool warm_picks;
  // Outputs: the selected blocks [B, G, n_sel] (NSA) and o [B, H·dv].
  int32_t* sel;
  bf16* o;
  // Phase timestamps [kTraceKernels, trace_ctas, kTracePhases] (null: off; decode_trace.cuh).
  uint64_t* trace;
  int64_t trace_ctas;
};

// The block sums (where l = 2d and l_sel = 4d, as m7c's 32, 16, 64, and the parts' scores are
// narrow: decode_tile.cuh): block j's selection score (docs/nsa.md, "Selection scores") is
// Σ_h Σ_i w_i·exp(s_hi − M_h) / L_h over its compressed tokens i = 4j − 1 .. 4j + 3, weights
// ½, 1, 1, 1, ½ – so over "quartet" j (tokens 4j .. 4j + 3) and the last token of quartet j − 1.
// Each part's warp, which holds 32 tokens (8 quartets) and its own max m_w of each head, leaves
// per head and quartet A_q = Σ p_i·w_i over tokens 4q .. 4q + 3 (w = 1, 1, 1, ½), B_q = ½·p_(4q+3)
// with p = exp(s − m_w), and m_w; the top-n then scores a block as
// Σ_h A_j·f_h(w(4j)) + B_(j−1)·f_h(w(4j − 1)), f_h(w) = exp(m_w − M_h) / L_h – the reference's
// terms summed in another order, so only near ties can choose differently. A row of one (sequence,
// group, head): A [sums_q], B [sums_q], the warps' maxes [sums_q / 8] (natural units, scaled).
__host__ __device__ constexpr int64_t block_sums_floats(int64_t sums_q) {
  return 2 * sums_q + sums_q / 8;
}
template <typename T>  // float (the parts write) or const float (the top-n reads)
__device__ __forceinline__ T* block_sums_row(const DecodeDims& m, T* sums, int bg, int h) {
  return sums + (static_cast<int64_t>(bg) * m.hpg + h) * block_sums_floats(m.sums_q);
}

__device__ __forceinline__ int num_cmp(const DecodeDims& m, int t) {
  return t + 1 < m.l ? 0 : m.div_d.div(t + 1 - m.l) + 1;
}

// The caches' one layout, [B, G, rows, dim]: row r of sequence b, group g is row
// (b·G + g)·rows + r of B·G·rows – its elements start at that times dim, and it is the row
// coordinate of the TMA maps over the cache. A group's rows are contiguous, so a part's 128 rows
// are one block of memory (cp.async's pieces in order, TMA's box a dense one).
__host__ __device__ __forceinline__ int64_t cache_row(int b, int g, int G, int64_t rows,
                                                      int64_t r) {
  return (static_cast<int64_t>(b) * G + g) * rows + r;
}

// Row r of sequence b, group g in a cache (cache_row).
template <typename T>  // bf16 or const bf16
__device__ __forceinline__ T* row(T* base, int b, int64_t rows, int64_t r, int g,
                                  const DecodeDims& m, int dim) {
  return base + cache_row(b, g, m.G, rows, r) * dim;
}

// First (head 0) row of slot `slot` of group-row bg in part_ml (×2) / part_o (×dv).
__device__ __forceinline__ int64_t part_index(const DecodeDims& m, int bg, int slot) {
  return (static_cast<int64_t>(bg) * m.slots + slot) * m.hpg;
}

// The forced selected blocks of position t (docs/nsa.md, "Top-n"): 0, c − 1, c (those ≥ 0,
// once each), ascending; the partial block c, if any, is the last.
__device__ __forceinline__ int num_forced(const DecodeDims& m, int t) {
  const int c = m.div_lsel.div(t);
  return 1 + (c - 1 > 0) + (c > 0);
}
__device__ __forceinline__ int forced_block(const DecodeDims& m, int t, int k) {
  const int c = m.div_lsel.div(t);
  return k == 0 ? 0 : (k == 1 && c - 1 > 0 ? c - 1 : c);
}
// The forced blocks after block 0 ("late": they move with t): c − 1 and c, those > 0.
__device__ __forceinline__ int num_late(const DecodeDims& m, int t) {
  return num_forced(m, t) - 1;
}
__device__ __forceinline__ int late_block(const DecodeDims& m, int t, int k) {
  return forced_block(m, t, k + 1);
}

// Selected part k over an ascending list of n blocks (only its last block may end before l_sel, at
// t): entries e0 .. e0 + nseg − 1, each seg_len keys from `off` into its block but the last,
// `count` keys in all. Key c of the part is key off + c mod seg_len of entry e0 + c / seg_len.
struct SelPart {
  int e0, nseg, off, count;
};

template <typename BlockAt>
__device__ __forceinline__ SelPart sel_part(const DecodeDims& m, int t, int k, int n,
                                            BlockAt&& block_at) {
  SelPart s{};
  if (m.sub == 1) {
    s.e0 = k * m.bpp;
    s.nseg = max(0, min(m.bpp, n - s.e0));
  } else {
    s.e0 = k / m.sub;
    s.nseg = s.e0 < n ? 1 : 0;
    s.off = (k % m.sub) * m.seg_len;
  }
  if (s.nseg == 0) return s;
  const int64_t last_start = static_cast<int64_t>(block_at(s.e0 + s.nseg - 1)) * m.l_sel + s.off;
  const int64_t last = min(static_cast<int64_t>(min(m.seg_len, m.l_sel - s.off)),
                           static_cast<int64_t>(t) + 1 - last_start);
  s.count = (s.nseg - 1) * m.seg_len + static_cast<int>(max(int64_t{0}, last));
  return s;
}

}  // namespace nsa::cuda::decode
