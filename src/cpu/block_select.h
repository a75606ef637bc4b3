// Selection-block importance scores and the exact top-n rule (docs/nsa.md, "Selection scores",
// "Top-n").
//
// accumulate_block_scores maps one head's compressed-attention probabilities onto selection
// blocks: compressed token i covers raw positions [i·d, i·d + l) and gives each selection block j
// the share |[i·d, i·d + l) ∩ [j·l_sel, (j+1)·l_sel)| / l of its probability. Calling it for every
// head of a group into one buffer gives the group score.
//
// select_blocks picks the blocks for query t: forced 0, c−1, c (c = t / l_sel), then complete
// blocks by score (higher first; on exact ties the lower index). Output is ascending, −1 padded.
// Both functions are O(number of blocks) in memory and share nothing across queries.
#pragma once

#include <cstdint>

#include "nsa/config.h"

namespace nsa::cpu {

// p_cmp [n_visible] (probabilities of compressed tokens 0..n_visible-1) → block_scores [blocks]
// (+=). Only blocks up to the one holding position n_visible·d + l − d − 1 are touched.
template <typename Real>
void accumulate_block_scores(const NsaConfig& cfg, const Real* p_cmp, int64_t n_visible,
                             Real* block_scores);

// scores [>= t / l_sel + 1] → out [n_sel]; returns the number of blocks chosen.
template <typename Real>
int64_t select_blocks(const Real* scores, int64_t t, int64_t l_sel, int64_t n_sel, int32_t* out);

}  // namespace nsa::cpu
