// Decoding with NSA caches reproduces the full forward exactly: for every position the logits
// and every layer's selected blocks are bit-identical to one forward over the same tokens
// (docs/inference.md, first section). Covers SwiGLU/SiLU, separate and
// shared K/V, φ avg and mlp, sigmoid and softmax gates, and windows that wrap their ring.
#include <gtest/gtest.h>

#include <random>

#include "../common/test_util.h"
#include "decode/model_decoder.h"
#include "decode/sampler.h"
#include "model/model_cpu.h"
#include "nsa/error.h"

namespace nsa::test {
namespace {

class DecodeEqualsForward : public ::testing::TestWithParam<bool> {};

TEST_P(DecodeEqualsForward, LogitsAndSelectionsBitIdentical) {
  const ModelConfig cfg = tiny_decode_model(GetParam());
  const ModelParams<float> params = init_model_params<float>(cfg);
  const int64_t S = 90;
  std::mt19937 rng(9);
  std::vector<int32_t> tokens(S), targets(S, 0);
  for (auto& t : tokens) t = static_cast<int32_t>(rng() % cfg.vocab_size);
  ModelStats full;
  full.keep_outputs = true;
  model_loss_cpu<float>(cfg, params, SeqLayout::batch(1, S), tokens, targets, nullptr, &full);

  ModelDecoder dec(cfg, params);
  const int64_t V = cfg.vocab_size, G = cfg.attn.groups, n_sel = cfg.attn.n_sel;
  int64_t free_choices = 0;  // selected blocks that were not forced: the top-n really chose
  for (int64_t t = 0; t < S; ++t) {
    const std::vector<float> logits = dec.step(tokens[t]);
    for (int64_t v = 0; v < V; ++v) {
      ASSERT_EQ(logits[v], full.logits[t * V + v]) << "logit " << v << " at position " << t;
    }
    for (int64_t li = 0; li < cfg.n_layers; ++li) {
      for (int64_t k = 0; k < G * n_sel; ++k) {
        ASSERT_EQ(dec.last_selection()[li][k], full.sel_idx[li][t * G * n_sel + k])
            << "layer " << li << " position " << t;
      }
      const int64_t c = t / cfg.attn.l_sel;
      for (int32_t b : dec.last_selection()[li]) free_choices += b >= 1 && b <= c - 2;
    }
  }
  EXPECT_GT(free_choices, 0);
  EXPECT_GT(dec.last_step_kv_bytes(), 0);
}

INSTANTIATE_TEST_SUITE_P(Variants, DecodeEqualsForward, ::testing::Values(false, true));

// The single-branch attention modes decode as they train: attention = full keeps a window as long
// as the decoder's maximum length (longer than the sequence here: any w ≥ S is the same
// attention), window keeps w; logits equal the full forward's bit for bit.
TEST(DecodeEqualsForward, AttentionFullAndWindow) {
  for (const char* mode : {"full", "window"}) {
    ModelConfig cfg = tiny_decode_model(false);
    set_model_field(cfg, "attention", mode);
    const ModelParams<float> params = init_model_params<float>(cfg);
    const int64_t S = 60, V = cfg.vocab_size;
    std::mt19937 rng(4);
    std::vector<int32_t> tokens(S), targets(S, 0);
    for (auto& t : tokens) t = static_cast<int32_t>(rng() % V);
    ModelStats full;
    full.keep_outputs = true;
    model_loss_cpu<float>(cfg, params, SeqLayout::batch(1, S), tokens, targets, nullptr, &full);
    ModelDecoder dec(cfg, params, S + 7);
    for (int64_t t = 0; t < S; ++t) {
      const std::vector<float> logits = dec.step(tokens[t]);
      for (int64_t v = 0; v < V; ++v) {
        ASSERT_EQ(logits[v], full.logits[t * V + v]) << mode << ": logit " << v << " at " << t;
      }
    }
  }
  ModelConfig cfg = tiny_decode_model(false);
  set_model_field(cfg, "attention", "full");
  const ModelParams<float> params = init_model_params<float>(cfg);
  EXPECT_THROW(ModelDecoder(cfg, params), Error) << "full attention needs the maximum length";
  ModelDecoder dec(cfg, params, 2);
  dec.step(1);
  dec.step(2);
  EXPECT_THROW(dec.step(3), Error) << "a step beyond the maximum length";
}

}  // namespace
}  // namespace nsa::test

namespace nsa::test {
namespace {

TEST(Sampler, GreedyTopKAndSeeds) {
  const std::vector<float> logits = {0.1f, 2.0f, -1.0f, 1.9f};
  SamplerConfig greedy;
  greedy.temperature = 0;
  EXPECT_EQ(Sampler(greedy).sample(logits), 1);
  SamplerConfig top1;
  top1.top_k = 1;
  EXPECT_EQ(Sampler(top1).sample(logits), 1);
  SamplerConfig nucleus;
  nucleus.top_p = 0.3;  // the most likely token alone holds more than 30 %
  EXPECT_EQ(Sampler(nucleus).sample(logits), 1);
  SamplerConfig a, b;
  a.seed = b.seed = 7;
  Sampler sa(a), sb(b);
  for (int i = 0; i < 50; ++i) ASSERT_EQ(sa.sample(logits), sb.sample(logits));
  SamplerConfig bad;
  bad.top_p = 0;
  EXPECT_THROW(Sampler{bad}, Error);
}

}  // namespace
}  // namespace nsa::test

namespace nsa::test {
namespace {

// Batched prefill leaves the cache exactly as token-by-token steps do: the following steps give
// bit-identical outputs and selections.
TEST(DecodeCache, PrefillEqualsStepping) {
  for (bool second : {false, true}) {
    NsaConfig cfg = tiny_decode_model(second).attn;
    const int64_t S = 60, extra = 15, T = S + extra, G = cfg.groups, H = cfg.heads;
    const NsaTensors<float> in = random_nsa_inputs<float>(cfg, T, 21);
    auto row = [](const Tensor<float>& t, int64_t r) {
      return t.ptr() + r * (t.numel() / t.dim(0));
    };
    NsaDecodeCache stepped(cfg), prefilled(cfg);
    std::vector<float> o_a(H * cfg.dv), o_b(H * cfg.dv);
    std::vector<int32_t> sel_a(G * cfg.n_sel), sel_b(G * cfg.n_sel);
    auto step = [&](NsaDecodeCache& c, int64_t t, float* o, int32_t* sel) {
      const float* k[kNumBranches];
      const float* v[kNumBranches];
      const float* g[kNumBranches];
      for (int b = 0; b < kNumBranches; ++b) {
        k[b] = row(in.k[cfg.kv_index(b)], t);
        v[b] = row(in.v[cfg.kv_index(b)], t);
        g[b] = row(in.gate[b], t);
      }
      c.step(row(in.q, t), k, v, g, &in.phi_k, &in.phi_v, o, sel);
    };
    for (int64_t t = 0; t < S; ++t) step(stepped, t, o_a.data(), sel_a.data());
    Tensor<float> k[kNumBranches], v[kNumBranches];
    for (int b = 0; b < kNumBranches; ++b) {
      if (cfg.kv_index(b) != b) continue;
      k[b] = Tensor<float>({S, G, cfg.dk});
      v[b] = Tensor<float>({S, G, cfg.dv});
      std::copy_n(in.k[b].ptr(), S * G * cfg.dk, k[b].ptr());
      std::copy_n(in.v[b].ptr(), S * G * cfg.dv, v[b].ptr());
    }
    prefilled.prefill(k, v, &in.phi_k, &in.phi_v);
    EXPECT_EQ(prefilled.num_compressed(), stepped.num_compressed());
    for (int64_t t = S; t < T; ++t) {
      step(stepped, t, o_a.data(), sel_a.data());
      step(prefilled, t, o_b.data(), sel_b.data());
      ASSERT_EQ(o_a, o_b) << "position " << t;
      ASSERT_EQ(sel_a, sel_b) << "position " << t;
      ASSERT_EQ(stepped.last_step_kv_bytes(), prefilled.last_step_kv_bytes());
    }
  }
}

}  // namespace
}  // namespace nsa::test
