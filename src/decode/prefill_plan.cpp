// Prompt checks, de-duplication and grouping of a batched prefill (see prefill_plan.h).
#include "prefill_plan.h"

#include <algorithm>
#include <unordered_map>

#include "nsa/error.h"

namespace nsa {
namespace {

// FNV-1a over the token ids: candidates for "the same prompt", confirmed by comparing them.
uint64_t prompt_hash(const std::vector<int32_t>& p) {
  uint64_t h = 1469598103934665603ull;
  for (int32_t t : p) {
    h ^= static_cast<uint32_t>(t);
    h *= 1099511628211ull;
  }
  return h ^ p.size();
}

}  // namespace

void check_prompt(const std::vector<int32_t>& prompt, int64_t index, int64_t vocab,
                  int64_t max_len) {
  const int64_t S = static_cast<int64_t>(prompt.size());
  NSA_CHECK(S > 0, "prefill: prompt ", index, " is empty (a prompt needs at least one token)");
  NSA_CHECK(S <= max_len, "prefill: prompt ", index, " holds ", S,
            " tokens; the decoder's caches hold ", max_len,
            " per sequence (raise the maximum length or shorten the prompt)");
  for (int64_t t = 0; t < S; ++t) {
    NSA_CHECK(prompt[t] >= 0 && prompt[t] < vocab, "prefill: token ", prompt[t], " at position ", t,
              " of prompt ", index, " is outside the vocabulary [0, ", vocab, ")");
  }
}

PrefillPlan plan_prefill(const std::vector<std::vector<int32_t>>& prompts, int64_t vocab,
                         int64_t max_len, int64_t token_budget) {
  NSA_CHECK(token_budget > 0, "prefill: the token budget must be positive, got ", token_budget);
  PrefillPlan plan;
  const int64_t N = static_cast<int64_t>(prompts.size());
  plan.source.resize(static_cast<size_t>(N));
  std::unordered_multimap<uint64_t, int64_t> seen;
  std::vector<int64_t> distinct;
  for (int64_t i = 0; i < N; ++i) {
    check_prompt(prompts[i], i, vocab, max_len);
    const uint64_t h = prompt_hash(prompts[i]);
    int64_t src = i;
    for (auto [it, end] = seen.equal_range(h); it != end; ++it) {
      if (prompts[it->second] == prompts[i]) {
        src = it->second;
        break;
      }
    }
    plan.source[i] = src;
    if (src == i) {
      seen.emplace(h, i);
      distinct.push_back(i);
    }
  }
  PrefillGroup group;
  std::vector<int64_t> cu = {0};
  const auto close = [&] {
    if (group.seqs.empty()) return;
    group.layout = SeqLayout::packed(cu, cu.back());
    plan.groups.push_back(std::move(group));
    group = PrefillGroup{};
    cu = {0};
  };
  for (int64_t i : distinct) {
    const int64_t S = static_cast<int64_t>(prompts[i].size());
    if (!group.seqs.empty() && cu.back() + S > token_budget) close();
    group.seqs.push_back(i);
    group.max_length = std::max(group.max_length, S);
    cu.push_back(cu.back() + S);
  }
  close();
  return plan;
}

void pack_prefill_group(const PrefillGroup& group, const std::vector<std::vector<int32_t>>& prompts,
                        std::vector<int32_t>& tokens, std::vector<int32_t>& positions) {
  const int64_t T = group.layout.total_tokens();
  tokens.resize(static_cast<size_t>(T));
  positions.resize(static_cast<size_t>(T));
  for (size_t i = 0; i < group.seqs.size(); ++i) {
    const std::vector<int32_t>& p = prompts[group.seqs[i]];
    const int64_t start = group.layout.start(static_cast<int64_t>(i));
    NSA_CHECK(static_cast<int64_t>(p.size()) == group.layout.length(static_cast<int64_t>(i)),
              "prefill: prompt ", group.seqs[i], " does not match its group's layout");
    std::copy(p.begin(), p.end(), tokens.begin() + start);
    for (size_t t = 0; t < p.size(); ++t) positions[start + t] = static_cast<int32_t>(t);
  }
}

}  // namespace nsa
