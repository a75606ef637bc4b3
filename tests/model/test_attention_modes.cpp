// The model's attention modes (include/nsa/model_config.h, docs/quality.md): `full` is the model
// with ordinary causal dense attention – checked against the model written out here with a naive
// dense attention (S × S scores: test sizes only) – in packed documents, loss and gradients;
// `window` never sees a key more than w − 1 positions back (a change there moves no logit);
// both leave the compressed and selected projections without gradient; bad values are refused
// with errors naming the field; old checkpoints without the field read as nsa.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "../common/test_util.h"
#include "cpu/ops/activations.h"
#include "cpu/ops/cross_entropy.h"
#include "cpu/ops/embedding.h"
#include "cpu/ops/linear.h"
#include "cpu/ops/rmsnorm.h"
#include "cpu/ops/rope.h"
#include "model/model_cpu.h"
#include "nsa/error.h"

namespace nsa::test {
namespace {

ModelConfig mode_config(const std::string& attention) {
  ModelConfig c;
  set_model_fields(c, {{"vocab_size", "29"},
                       {"dim", "16"},
                       {"n_layers", "2"},
                       {"seq_len", "64"},
                       {"heads", "4"},
                       {"groups", "2"},
                       {"dk", "6"},
                       {"dv", "4"},
                       {"l", "4"},
                       {"d", "2"},
                       {"l_sel", "4"},
                       {"n_sel", "3"},
                       {"w", "5"},
                       {"init_std", "0.3"},
                       {"attention", attention}});
  c.validate();
  return c;
}

// The model of model_cpu.h with its attention written out as dense causal softmax attention over
// the window branch's keys and values, scaled by the window gate: what attention = full must be.
// Sigmoid gates, separate K/V, SwiGLU, tied head (the config above).
double dense_model_loss(const ModelConfig& cfg, const ModelParams<double>& P,
                        const SeqLayout& layout, const std::vector<int32_t>& tokens,
                        const std::vector<int32_t>& targets) {
  const NsaConfig& a = cfg.attn;
  const int64_t T = layout.total_tokens(), H = a.heads, G = a.groups, dk = a.dk, dv = a.dv;
  const double scale = 1.0 / std::sqrt(static_cast<double>(dk));
  Tensor<double> x, h, rstd, q, k, v, z, y;
  cpu::embedding_forward(tokens, P.tok_emb, x);
  for (const LayerParams<double>& L : P.layers) {
    cpu::rmsnorm_forward(x, L.attn_norm, cfg.norm_eps, h, rstd);
    cpu::linear_forward(h, L.wq, nullptr, q);
    q.shape = {T, H, dk};
    cpu::rope_apply(q, layout, cfg.rope_base, false);
    cpu::linear_forward(h, L.wk[kWin], nullptr, k);
    k.shape = {T, G, dk};
    cpu::rope_apply(k, layout, cfg.rope_base, false);
    cpu::linear_forward(h, L.wv[kWin], nullptr, v);  // [T, G·dv]
    cpu::linear_forward(h, L.wg, &L.bg, z);          // [T, 3H], column h·3 + branch
    Tensor<double> o({T, H * dv});
    for (int64_t n = 0; n < layout.num_seqs(); ++n) {
      const int64_t s0 = layout.start(n), s1 = s0 + layout.length(n);
      for (int64_t t = s0; t < s1; ++t) {
        for (int64_t hh = 0; hh < H; ++hh) {
          const int64_t g = hh / (H / G);
          const double gate = 1.0 / (1.0 + std::exp(-z[t * 3 * H + hh * 3 + kWin]));
          std::vector<double> p;
          double m = -INFINITY, sum = 0;
          for (int64_t j = s0; j <= t; ++j) {
            double dot = 0;
            for (int64_t c = 0; c < dk; ++c)
              dot += q[(t * H + hh) * dk + c] * k[(j * G + g) * dk + c];
            p.push_back(dot * scale);
            m = std::max(m, p.back());
          }
          for (double& e : p) sum += (e = std::exp(e - m));
          for (int64_t c = 0; c < dv; ++c) {
            double acc = 0;
            for (int64_t j = s0; j <= t; ++j) acc += p[j - s0] * v[j * G * dv + g * dv + c];
            o[t * H * dv + hh * dv + c] = gate * acc / sum;
          }
        }
      }
    }
    cpu::linear_forward(o, L.wo, nullptr, y);
    for (int64_t i = 0; i < x.numel(); ++i) x[i] += y[i];
    Tensor<double> h2, r2, u1, u3, mm;
    cpu::rmsnorm_forward(x, L.ffn_norm, cfg.norm_eps, h2, r2);
    cpu::linear_forward(h2, L.w1, nullptr, u1);
    cpu::linear_forward(h2, L.w3, nullptr, u3);
    cpu::swiglu_forward(u1, u3, mm);
    cpu::linear_forward(mm, L.w2, nullptr, y);
    for (int64_t i = 0; i < x.numel(); ++i) x[i] += y[i];
  }
  Tensor<double> hf, logits;
  cpu::rmsnorm_forward(x, P.norm, cfg.norm_eps, hf, rstd);
  cpu::linear_forward(hf, P.tok_emb, nullptr, logits);
  return cpu::cross_entropy<double>(logits, targets, nullptr);
}

struct Problem {
  SeqLayout layout = SeqLayout::packed({0, 23, 64}, 64);  // two documents, neither ≤ w = 5
  std::vector<int32_t> tokens, targets;
  explicit Problem(int64_t vocab) {
    std::mt19937 rng(5);
    for (int64_t t = 0; t < layout.total_tokens(); ++t) {
      tokens.push_back(static_cast<int32_t>(rng() % vocab));
      targets.push_back(static_cast<int32_t>(rng() % vocab));
    }
  }
};

TEST(AttentionModes, FullIsDenseCausalAttention) {
  const ModelConfig full = mode_config("full");
  const ModelParams<double> params = init_model_params<double>(full);
  const Problem x(full.vocab_size);
  const double ref = dense_model_loss(full, params, x.layout, x.tokens, x.targets);
  const double got = model_loss_cpu<double>(full, params, x.layout, x.tokens, x.targets, nullptr);
  std::printf("  dense reference %.15f, attention = full %.15f (rel %.1e)\n", ref, got,
              std::abs(got - ref) / ref);
  EXPECT_NEAR(got, ref, 1e-12 * ref);
  // The window at w ≥ S is the same thing; at the config's w = 5 and in NSA it is not (the
  // reference tells them apart).
  ModelConfig wide = mode_config("window");
  set_model_field(wide, "w", "41");  // the longest document
  EXPECT_NEAR(model_loss_cpu<double>(wide, params, x.layout, x.tokens, x.targets, nullptr), ref,
              1e-12 * ref);
  for (const char* other : {"window", "nsa"}) {
    const double loss =
        model_loss_cpu<double>(mode_config(other), params, x.layout, x.tokens, x.targets, nullptr);
    EXPECT_GT(std::abs(loss - ref), 1e-6) << other << " must differ from dense attention";
  }
}

// The backward runs the widened window too: gradients match finite differences, and the
// compressed and selected projections (kept, so checkpoints have the same tensors) get none.
TEST(AttentionModes, GradientsOfTheSingleBranchModes) {
  for (const char* mode : {"full", "window"}) {
    const ModelConfig cfg = mode_config(mode);
    ModelParams<double> params = init_model_params<double>(cfg);
    const Problem x(cfg.vocab_size);
    ModelParams<double> grads = zeros_like(cfg, params);
    model_loss_cpu<double>(cfg, params, x.layout, x.tokens, x.targets, &grads);
    auto named = params.named(cfg);
    auto gnamed = grads.named(cfg);
    std::mt19937 rng(7);
    int unused = 0, checked = 0;
    for (size_t p = 0; p < named.size(); ++p) {
      const std::string& name = named[p].first;
      const Tensor<double>& g = *gnamed[p].second;
      double norm = 0;
      for (double e : g.data) norm += e * e;
      if (name.find("_cmp") != std::string::npos || name.find("_sel") != std::string::npos) {
        EXPECT_EQ(norm, 0.0) << mode << ": " << name << " must get no gradient";
        ++unused;
        continue;
      }
      EXPECT_GT(norm, 0.0) << mode << ": " << name << " has no gradient";
      if (name.find("attention.w") == std::string::npos) continue;  // wq, wk_win, wv_win, wg, wo
      Tensor<double>& w = *named[p].second;
      for (int s = 0; s < 4; ++s) {
        const int64_t i = static_cast<int64_t>(rng() % w.numel());
        const double saved = w[i], h = 1e-6;
        w[i] = saved + h;
        const double lp =
            model_loss_cpu<double>(cfg, params, x.layout, x.tokens, x.targets, nullptr);
        w[i] = saved - h;
        const double lm =
            model_loss_cpu<double>(cfg, params, x.layout, x.tokens, x.targets, nullptr);
        w[i] = saved;
        const double fd = (lp - lm) / (2 * h);
        EXPECT_NEAR(g[i], fd, 1e-8 + 1e-5 * std::abs(fd))
            << mode << ": " << name << "[" << i << "]";
        ++checked;
      }
    }
    EXPECT_EQ(unused, 4 * static_cast<int>(cfg.n_layers)) << "wk_cmp, wv_cmp, wk_sel, wv_sel";
    EXPECT_GT(checked, 30);
  }
}

// One layer: the logits at t see tokens t − w + 1 .. t only. A token changed at p moves the
// logits at p .. p + w − 1 and none after (bit for bit); in NSA the change reaches further.
TEST(AttentionModes, WindowIgnoresKeysBeyondW) {
  for (const char* mode : {"window", "nsa"}) {
    ModelConfig cfg = mode_config(mode);
    set_model_field(cfg, "n_layers", "1");
    const ModelParams<float> params = init_model_params<float>(cfg);
    const int64_t S = 64, V = cfg.vocab_size, w = cfg.attn.w, p = 10;
    const SeqLayout layout = SeqLayout::batch(1, S);
    Problem x(V);
    ModelStats a, b;
    a.keep_outputs = b.keep_outputs = true;
    model_loss_cpu<float>(cfg, params, layout, x.tokens, x.targets, nullptr, &a);
    x.tokens[p] = (x.tokens[p] + 1) % static_cast<int32_t>(V);
    model_loss_cpu<float>(cfg, params, layout, x.tokens, x.targets, nullptr, &b);
    int64_t moved_inside = 0, moved_beyond = 0;
    for (int64_t t = 0; t < S; ++t) {
      bool moved = false;
      for (int64_t v = 0; v < V; ++v) moved |= a.logits[t * V + v] != b.logits[t * V + v];
      if (t < p) {
        EXPECT_FALSE(moved) << mode << ": position " << t << " saw the future";
      }
      if (t >= p && t < p + w) moved_inside += moved;
      if (t >= p + w) moved_beyond += moved;
    }
    EXPECT_EQ(moved_inside, w) << mode;
    if (std::string(mode) == "window") {
      EXPECT_EQ(moved_beyond, 0) << "the window branch alone saw a key more than w − 1 back";
    } else {
      EXPECT_GT(moved_beyond, 0) << "NSA's compressed and selected branches reach beyond w";
    }
  }
}

TEST(AttentionModes, BadValuesAndCombinationsAreRefused) {
  ModelConfig c = mode_config("nsa");
  set_model_field(c, "attention", "dense");
  try {
    c.validate();
    FAIL() << "attention = dense accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("attention = 'dense' is not one of: nsa, full, window"),
              std::string::npos)
        << e.what();
  }
  c = mode_config("window");
  set_model_field(c, "branches", "sel,win");
  try {
    c.validate();
    FAIL() << "attention = window with branches = sel,win accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("branches = 'sel,win'"), std::string::npos) << e.what();
  }
  // The field round-trips through the checkpoint's text fields, and only full widens w.
  const ModelConfig full = mode_config("full");
  EXPECT_EQ(model_config_fields(full).at("attention"), "full");
  EXPECT_EQ(full.layer_attention(100).w, 100);
  EXPECT_EQ(full.layer_attention(3).w, 5);
  EXPECT_EQ(mode_config("window").layer_attention(100).w, 5);
  EXPECT_FALSE(full.branch_enabled(kCmp));
  EXPECT_FALSE(full.branch_enabled(kSel));
  EXPECT_TRUE(full.branch_enabled(kWin));
}

}  // namespace
}  // namespace nsa::test
