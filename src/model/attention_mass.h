// How much of a query row's attention falls on a span of key tokens, per head and branch – the
// needle probe's question after "was the needle selected?"
// (train/needle_eval.h): a head can select the needle's block and still look elsewhere within
// it. Read off the CPU forward's saved state (the rotated q and k, the compressed keys, the
// selection and each branch's log-sum-exp), so it costs a dot product per key of the span.
#pragma once

#include <cstdint>
#include <vector>

#include "nsa/attention.h"
#include "nsa/config.h"

namespace nsa {

// Query row `row` (a token of the layout) and the key tokens [begin, end) of the same sequence.
struct MassQuery {
  int64_t row = 0, begin = 0, end = 0;
};

// For each query, head and branch, [queries.size(), H, 3] in branch order (cmp, sel, win): the
// softmax probability the branch puts on the span – the compressed branch on its visible
// compressed tokens that cover any of the span's tokens (each covers l of them), the selected
// branch on the span's keys in the row's selected blocks and not after it, the window branch on
// those within its w tokens. A span outside the row's sequence is an error naming the query.
template <typename Real>
std::vector<float> attention_mass(const NsaConfig& cfg, const SeqLayout& layout,
                                  const NsaTensors<Real>& in, const NsaForward<Real>& fwd,
                                  const std::vector<MassQuery>& queries);

}  // namespace nsa
