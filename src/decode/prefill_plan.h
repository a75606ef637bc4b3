// How a batch of prompts is prefilled (docs/inference.md, "Prefill"): every prompt checked
// (non-empty, fits the caches, tokens in the vocabulary), prompts identical to an earlier one
// marked to copy its caches instead of running again, and the distinct ones cut into groups
// packed back to back (a SeqLayout, FlashAttention-style cu_seqlens) whose token count stays
// within a budget – one forward per group. Host-only bookkeeping: the GPU decoder
// (decode/cuda/model_decoder_cuda.h) runs the groups; the CPU decoder checks its prompt here too.
#pragma once

#include <cstdint>
#include <vector>

#include "nsa/config.h"

namespace nsa {

// One forward of the prefill: the decoder sequences whose prompts it packs, in order, and their
// layout (sequence i of the layout is decoder sequence seqs[i]).
struct PrefillGroup {
  std::vector<int64_t> seqs;
  SeqLayout layout;
  int64_t max_length = 0;  // the longest prompt of the group
};

struct PrefillPlan {
  // Per decoder sequence: the sequence whose prefill it copies (itself when its prompt is the
  // first of its kind).
  std::vector<int64_t> source;
  std::vector<PrefillGroup> groups;
};

// Throws nsa::Error naming prompt `index` unless it is non-empty, holds at most `max_len` tokens
// and every token lies in [0, vocab).
void check_prompt(const std::vector<int32_t>& prompt, int64_t index, int64_t vocab,
                  int64_t max_len);

// The plan for `prompts` (one per decoder sequence): checked as above, de-duplicated, grouped
// greedily in sequence order so that a group holds at most `token_budget` tokens – or a single
// prompt longer than the budget.
PrefillPlan plan_prefill(const std::vector<std::vector<int32_t>>& prompts, int64_t vocab,
                         int64_t max_len, int64_t token_budget);

// A group's prompts packed back to back: tokens [T] and their positions [T] (restarting at 0 in
// each prompt, as RoPE and the attention see them).
void pack_prefill_group(const PrefillGroup& group, const std::vector<std::vector<int32_t>>& prompts,
                        std::vector<int32_t>& tokens, std::vector<int32_t>& positions);

}  // namespace nsa
