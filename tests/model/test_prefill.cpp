// Batched prefill on the CPU and the host-side plan of the GPU prefill (docs/inference.md,
// "Prefill"): a prompt run through one forward leaves the caches exactly as decoding it token by
// token does – the logits after the prompt and every later step, and every selected block, are
// bit-identical – for prompt lengths that are multiples of no block size; and the plan checks,
// de-duplicates and groups prompts as documented.
#include <gtest/gtest.h>

#include <random>

#include "../common/test_util.h"
#include "decode/model_decoder.h"
#include "decode/prefill_plan.h"
#include "nsa/error.h"

namespace nsa::test {
namespace {

class CpuPrefill : public ::testing::TestWithParam<bool> {};

TEST_P(CpuPrefill, EqualsDecodingTokenByToken) {
  const ModelConfig cfg = tiny_decode_model(GetParam());
  const ModelParams<float> params = init_model_params<float>(cfg);
  std::mt19937 rng(31);
  // 1 (nothing compressed), 7 (< l), 45 and 83 (past w, several selection blocks): no multiple
  // of d = 4, l = l_sel = 8 or w = 11.
  for (const int64_t S : {1, 7, 45, 83}) {
    std::vector<int32_t> prompt(static_cast<size_t>(S)), more(13);
    for (auto& t : prompt) t = static_cast<int32_t>(rng() % cfg.vocab_size);
    for (auto& t : more) t = static_cast<int32_t>(rng() % cfg.vocab_size);
    ModelDecoder stepped(cfg, params), prefilled(cfg, params);
    std::vector<float> a;
    for (int32_t t : prompt) a = stepped.step(t);
    std::vector<float> b = prefilled.prefill(prompt);
    ASSERT_EQ(prefilled.position(), S);
    ASSERT_EQ(a, b) << "logits after a prompt of " << S;
    ASSERT_EQ(stepped.last_selection(), prefilled.last_selection()) << "prompt of " << S;
    for (size_t i = 0; i < more.size(); ++i) {
      a = stepped.step(more[i]);
      b = prefilled.step(more[i]);
      ASSERT_EQ(a, b) << "step " << i << " after a prompt of " << S;
      ASSERT_EQ(stepped.last_selection(), prefilled.last_selection()) << "step " << i;
      ASSERT_EQ(stepped.last_step_kv_bytes(), prefilled.last_step_kv_bytes());
    }
  }
}

TEST_P(CpuPrefill, RejectsBadPrompts) {
  const ModelConfig cfg = tiny_decode_model(GetParam());
  const ModelParams<float> params = init_model_params<float>(cfg);
  ModelDecoder dec(cfg, params);
  EXPECT_THROW(dec.prefill({}), Error);
  EXPECT_THROW(dec.prefill({1, static_cast<int32_t>(cfg.vocab_size)}), Error);
  dec.step(1);
  EXPECT_THROW(dec.prefill({1, 2}), Error);  // not a fresh decoder
}

INSTANTIATE_TEST_SUITE_P(Variants, CpuPrefill, ::testing::Values(false, true));

// The single-branch attention modes (docs/quality.md): the prefill's forward widens the window
// of `full` to the prompt, the decoder's caches to their maximum length – the same keys, so the
// same logits bit for bit; a prompt longer than the caches is refused.
TEST(CpuPrefill, AttentionFullAndWindowEqualDecodingTokenByToken) {
  for (const char* mode : {"full", "window"}) {
    ModelConfig cfg = tiny_decode_model(false);
    set_model_field(cfg, "attention", mode);
    const ModelParams<float> params = init_model_params<float>(cfg);
    std::mt19937 rng(5);
    std::vector<int32_t> prompt(45), more(9);
    for (auto& t : prompt) t = static_cast<int32_t>(rng() % cfg.vocab_size);
    for (auto& t : more) t = static_cast<int32_t>(rng() % cfg.vocab_size);
    const int64_t max_len = 45 + 9;
    ModelDecoder stepped(cfg, params, max_len), prefilled(cfg, params, max_len);
    std::vector<float> a;
    for (int32_t t : prompt) a = stepped.step(t);
    ASSERT_EQ(a, prefilled.prefill(prompt)) << mode;
    for (int32_t t : more) ASSERT_EQ(stepped.step(t), prefilled.step(t)) << mode;
    ModelDecoder small(cfg, params, 44);
    EXPECT_THROW(small.prefill(prompt), Error) << mode << ": 45 tokens into caches of 44";
  }
}

TEST(PrefillPlan, ChecksPrompts) {
  EXPECT_NE(error_of([] { check_prompt({}, 3, 10, 100); }).find("prompt 3 is empty"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              check_prompt({1, 2, 3}, 0, 10, 2);
            }).find("holds 3 tokens"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              check_prompt({1, 10}, 1, 10, 100);
            }).find("token 10 at position 1 of prompt 1"),
            std::string::npos);
  EXPECT_NE(error_of([] { check_prompt({-1}, 0, 10, 100); }).find("outside the vocabulary"),
            std::string::npos);
  EXPECT_EQ(error_of([] { check_prompt({0, 9}, 0, 10, 2); }), "");
  EXPECT_THROW(plan_prefill({{1}, {}}, 10, 100, 64), Error);
  EXPECT_THROW(plan_prefill({{1}}, 10, 100, 0), Error);
}

TEST(PrefillPlan, DeduplicatesAndGroupsWithinTheBudget) {
  const std::vector<std::vector<int32_t>> prompts = {
      {1, 2, 3},                       // 0
      {4, 5},                          // 1
      {1, 2, 3},                       // 2: as 0
      {6, 6, 6, 6, 6},                 // 3
      {1, 2},                          // 4: a prefix of 0, not the same prompt
      {4, 5},                          // 5: as 1
      {7, 7, 7, 7, 7, 7, 7, 7, 7, 7},  // 6: longer than the budget, alone
      {8}};                            // 7
  const PrefillPlan plan = plan_prefill(prompts, 10, 16, 8);
  EXPECT_EQ(plan.source, (std::vector<int64_t>{0, 1, 0, 3, 4, 1, 6, 7}));
  ASSERT_EQ(plan.groups.size(), 4u);
  EXPECT_EQ(plan.groups[0].seqs, (std::vector<int64_t>{0, 1}));  // 3 + 2; + 5 would be 10 > 8
  EXPECT_EQ(plan.groups[0].layout.cu_seqlens, (std::vector<int64_t>{0, 3, 5}));
  EXPECT_EQ(plan.groups[0].max_length, 3);
  EXPECT_EQ(plan.groups[1].seqs, (std::vector<int64_t>{3, 4}));
  EXPECT_EQ(plan.groups[2].seqs, (std::vector<int64_t>{6}));  // 10 tokens: over, so alone
  EXPECT_EQ(plan.groups[2].max_length, 10);
  EXPECT_EQ(plan.groups[3].seqs, (std::vector<int64_t>{7}));
  std::vector<int32_t> tokens, positions;
  pack_prefill_group(plan.groups[1], prompts, tokens, positions);
  EXPECT_EQ(tokens, (std::vector<int32_t>{6, 6, 6, 6, 6, 1, 2}));
  EXPECT_EQ(positions, (std::vector<int32_t>{0, 1, 2, 3, 4, 0, 1}));
  // A budget of 1 puts every distinct prompt alone.
  const PrefillPlan alone = plan_prefill(prompts, 10, 16, 1);
  EXPECT_EQ(alone.groups.size(), 6u);
  for (const PrefillGroup& g : alone.groups) EXPECT_EQ(g.seqs.size(), 1u);
}

}  // namespace
}  // namespace nsa::test
