// The CPU language model: configs load and validate; every parameter's gradient matches finite
// differences in double (two variants covering SwiGLU/SiLU, separate/shared K/V, φ avg/mlp,
// sigmoid/softmax gates, tied/untied head, packed documents); the initial loss is ln(vocab).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>

#include "../common/test_util.h"
#include "model/model_cpu.h"
#include "nsa/error.h"

namespace nsa::test {
namespace {

ModelConfig tiny_variant(bool second) {
  ModelConfig c;
  set_model_fields(c, {{"vocab_size", "13"},
                       {"dim", "12"},
                       {"n_layers", "2"},
                       {"seq_len", "32"},
                       {"heads", second ? "3" : "4"},
                       {"groups", second ? "1" : "2"},
                       {"dk", "4"},
                       {"dv", second ? "6" : "4"},
                       {"l", "4"},
                       {"d", "2"},
                       {"l_sel", "4"},
                       {"n_sel", "3"},
                       {"w", "5"},
                       {"init_std", "0.3"}});
  if (second) {
    set_model_fields(c, other_options());
    set_model_field(c, "mlp_hidden", "10");
  }
  c.validate();
  return c;
}

TEST(ModelConfig, ShippedConfigsLoadAndValidate) {
  for (const char* name : {"tiny", "small", "needle_small", "m7c_125m", "paper_attn"}) {
    const std::string path = std::string(NSA_SOURCE_DIR) + "/configs/" + name + ".yaml";
    const ModelConfig c = load_model_config(path);
    EXPECT_NO_THROW(c.validate()) << name;
  }
  const ModelConfig m = load_model_config(std::string(NSA_SOURCE_DIR) + "/configs/m7c_125m.yaml");
  EXPECT_EQ(m.dim, 768);
  EXPECT_EQ(m.attn.heads, 12);
  EXPECT_EQ(m.attn.n_sel, 16);
}

TEST(ModelConfig, ErrorsNameTheFieldAndFile) {
  const auto dir = std::filesystem::temp_directory_path();
  const std::string bad = (dir / "nsa_bad.yaml").string();
  std::ofstream(bad) << "dim: 64\nwindow: 3\n";
  try {
    load_model_config(bad);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("nsa_bad.yaml"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("'window'"), std::string::npos) << e.what();
  }
  ModelConfig c = tiny_variant(false);
  EXPECT_THROW(set_model_field(c, "dim", "big"), Error);
  set_model_field(c, "mlp", "gelu");
  EXPECT_THROW(c.validate(), Error);
  EXPECT_THROW(load_model_config((dir / "nsa_missing.yaml").string()), Error);
}

// 0: SwiGLU, separate K/V, avg, sigmoid, tied. 1: SiLU, shared K/V, mlp, softmax, untied.
// 2: as 1 with only the cmp and win branches (the sel gate forced to 0).
class ModelGradient : public ::testing::TestWithParam<int> {};

TEST_P(ModelGradient, MatchesFiniteDifferences) {
  ModelConfig cfg = tiny_variant(GetParam() >= 1);
  if (GetParam() == 2) set_model_field(cfg, "branches", "cmp,win");
  ModelParams<double> params = init_model_params<double>(cfg);
  const SeqLayout layout = SeqLayout::packed({0, 11, 30}, 30);
  std::mt19937 rng(3);
  std::vector<int32_t> tokens(30), targets(30);
  for (auto& t : tokens) t = static_cast<int32_t>(rng() % cfg.vocab_size);
  for (auto& t : targets) t = static_cast<int32_t>(rng() % cfg.vocab_size);
  ModelParams<double> grads = zeros_like(cfg, params);
  model_loss_cpu(cfg, params, layout, tokens, targets, &grads);
  auto named = params.named(cfg);
  auto gnamed = grads.named(cfg);
  const double h = 1e-6;
  int checked = 0;
  for (size_t p = 0; p < named.size(); ++p) {
    Tensor<double>& x = *named[p].second;
    double worst = 0;
    for (int s = 0; s < 6; ++s) {
      const int64_t i = static_cast<int64_t>(rng() % x.numel());
      const double saved = x[i];
      x[i] = saved + h;
      const double lp = model_loss_cpu<double>(cfg, params, layout, tokens, targets, nullptr);
      x[i] = saved - h;
      const double lm = model_loss_cpu<double>(cfg, params, layout, tokens, targets, nullptr);
      x[i] = saved;
      const double fd = (lp - lm) / (2 * h), an = (*gnamed[p].second)[i];
      const double ratio = std::fabs(fd - an) / (1e-8 + 1e-5 * std::fabs(fd));
      worst = std::max(worst, ratio);
      EXPECT_LE(ratio, 1.0) << named[p].first << "[" << i << "]: fd " << fd << " vs " << an;
      ++checked;
    }
    std::printf("  %-36s headroom %.1fx\n", named[p].first.c_str(),
                worst > 0 ? 1 / worst : INFINITY);
  }
  EXPECT_GT(checked, 100);
}

INSTANTIATE_TEST_SUITE_P(Variants, ModelGradient, ::testing::Values(0, 1, 2));

TEST(Model, ForcedBranchesHaveZeroGatesAndBadListsAreRefused) {
  ModelConfig cfg = tiny_variant(false);
  set_model_field(cfg, "branches", "win");
  const ModelParams<float> params = init_model_params<float>(cfg);
  std::vector<int32_t> tokens(32, 3), targets(32, 4);
  ModelStats stats;
  model_loss_cpu<float>(cfg, params, SeqLayout::batch(1, 32), tokens, targets, nullptr, &stats);
  EXPECT_EQ(stats.gate_mean[kCmp], 0.0);
  EXPECT_EQ(stats.gate_mean[kSel], 0.0);
  EXPECT_GT(stats.gate_mean[kWin], 0.1);
  set_model_field(cfg, "branches", "win,attn");
  EXPECT_THROW(cfg.validate(), Error);
}

TEST(Model, InitialLossIsLogVocabAndBadTokensAreRefused) {
  ModelConfig cfg = tiny_variant(false);
  set_model_field(cfg, "init_std", "0.02");
  set_model_field(cfg, "vocab_size", "256");
  const ModelParams<float> params = init_model_params<float>(cfg);
  std::vector<int32_t> tokens(64), targets(64);
  for (int i = 0; i < 64; ++i) tokens[i] = (i * 37) % 256, targets[i] = (i * 11 + 5) % 256;
  const double loss =
      model_loss_cpu(cfg, params, SeqLayout::batch(2, 32), tokens, targets, nullptr);
  EXPECT_NEAR(loss, std::log(256.0), 0.05);
  tokens[40] = 256;
  try {
    model_loss_cpu(cfg, params, SeqLayout::batch(2, 32), tokens, targets, nullptr);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("token id 256 at position 40"), std::string::npos);
  }
}

}  // namespace
}  // namespace nsa::test

namespace nsa::test {
namespace {

TEST(Model, AnomalyModeNamesTheFirstNonFiniteTensor) {
  const ModelConfig cfg = tiny_variant(false);
  ModelParams<float> params = init_model_params<float>(cfg);
  std::vector<int32_t> tokens(24, 1), targets(24, 2);
  const SeqLayout layout = SeqLayout::batch(1, 24);
  ModelStats stats;
  stats.check_finite = true;
  ModelParams<float> grads = zeros_like(cfg, params);
  EXPECT_NO_THROW(model_loss_cpu<float>(cfg, params, layout, tokens, targets, &grads, &stats));
  params.layers[1].wo[5] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(std::isnan(model_loss_cpu<float>(cfg, params, layout, tokens, targets, nullptr)));
  try {
    model_loss_cpu<float>(cfg, params, layout, tokens, targets, &grads, &stats);
    FAIL() << "anomaly mode let a NaN through";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("layer 1 attention projection (wo) output"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace nsa::test

namespace nsa::test {
namespace {

// Every freely chosen block is counted once in the distance histogram, in the right bucket range.
TEST(Model, SelectionDistanceHistogramCountsFreeChoices) {
  ModelConfig cfg = tiny_variant(false);
  set_model_field(cfg, "n_sel", "5");
  const ModelParams<float> params = init_model_params<float>(cfg);
  const int64_t S = 40;
  std::vector<int32_t> tokens(S), targets(S, 0);
  for (int64_t i = 0; i < S; ++i) tokens[i] = static_cast<int32_t>(i % cfg.vocab_size);
  ModelStats stats;
  model_loss_cpu<float>(cfg, params, SeqLayout::batch(1, S), tokens, targets, nullptr, &stats);
  int64_t expected = 0;
  for (int64_t t = 0; t < S; ++t) {
    const int64_t c = t / cfg.attn.l_sel, forced = 1 + (c >= 1) + (c >= 2);
    expected += std::min(cfg.attn.n_sel - forced, std::max<int64_t>(0, c - 2));
  }
  expected *= cfg.attn.groups * cfg.n_layers;
  int64_t counted = 0;
  for (int64_t k = 0; k < 16; ++k) counted += stats.sel_distance_hist[k];
  EXPECT_GT(expected, 0);
  EXPECT_EQ(counted, expected);
  EXPECT_EQ(stats.sel_distance_hist[0], 0);  // distance 1 is the forced block c−1
}

TEST(Model, PerLayerTelemetryCoversEveryLayer) {
  const ModelConfig cfg = tiny_variant(false);
  ModelParams<float> params = init_model_params<float>(cfg);
  ModelParams<float> grads = zeros_like(cfg, params);
  const int64_t S = 64;
  std::vector<int32_t> tokens(2 * S, 1), targets(2 * S, 2);
  ModelStats stats;
  model_loss_cpu<float>(cfg, params, SeqLayout::batch(2, S), tokens, targets, &grads, &stats);
  ASSERT_EQ(static_cast<int64_t>(stats.layer_forward_ms.size()), cfg.n_layers);
  ASSERT_EQ(static_cast<int64_t>(stats.layer_backward_ms.size()), cfg.n_layers);
  ASSERT_EQ(static_cast<int64_t>(stats.layer_bytes.size()), cfg.n_layers);
  for (int64_t li = 0; li < cfg.n_layers; ++li) {
    EXPECT_GT(stats.layer_forward_ms[li], 0.0);
    EXPECT_GT(stats.layer_backward_ms[li], 0.0);
    // At least the layer's saved input, normed inputs and MLP activations: 2·S·dim·4 per tensor.
    EXPECT_GT(stats.layer_bytes[li], 4 * 2 * S * cfg.dim * static_cast<int64_t>(sizeof(float)));
  }
}

}  // namespace
}  // namespace nsa::test
