// Finite-difference checks, in double, of every gradient the backward returns: q, K/V of each
// branch (or the shared K/V), the three gates, and φ = mlp's parameters; plus the gate activation.
//
// Loss L = Σ do·o for a random do. Central differences with h = 1e-6 have truncation error
// O(h²) ≈ 1e-12 and rounding error ≈ 1e-16 / h = 1e-10, so 1e-7 absolute + 1e-6 relative is a
// tolerance with headroom. Block selection is discrete: a perturbation that changes any selected
// set is skipped (counted; random inputs never sit that close to a tie in practice).
#include <gtest/gtest.h>

#include <random>

#include "../common/test_util.h"

namespace nsa::test {
namespace {

double loss(const NsaConfig& cfg, const SeqLayout& layout, const NsaTensors<double>& in,
            const Tensor<double>& d_o, Tensor<int32_t>* sel) {
  const NsaForward<double> f = nsa_forward_cpu(cfg, layout, in);
  if (sel) *sel = f.sel_idx;
  double s = 0;
  for (int64_t i = 0; i < f.o.numel(); ++i) s += f.o[i] * d_o[i];
  return s;
}

// Named pointers to every input tensor and its gradient.
std::vector<std::tuple<std::string, Tensor<double>*, const Tensor<double>*>> tensor_pairs(
    const NsaConfig& cfg, NsaTensors<double>& in, const NsaTensors<double>& grad) {
  std::vector<std::tuple<std::string, Tensor<double>*, const Tensor<double>*>> out;
  out.emplace_back("q", &in.q, &grad.q);
  for (int c = 0; c < kNumBranches; ++c) {
    if (cfg.kv_index(c) == c) {
      const std::string suffix =
          cfg.kv == KvMode::kShared ? "" : std::string("_") + kBranchNames[c];
      out.emplace_back("k" + suffix, &in.k[c], &grad.k[c]);
      out.emplace_back("v" + suffix, &in.v[c], &grad.v[c]);
    }
    out.emplace_back(std::string("g_") + kBranchNames[c], &in.gate[c], &grad.gate[c]);
  }
  if (cfg.phi == Phi::kMlp) {
    for (auto [name, p, g] : {std::tuple{"phi_k", &in.phi_k, &grad.phi_k},
                              std::tuple{"phi_v", &in.phi_v, &grad.phi_v}}) {
      const std::string n = name;
      out.emplace_back(n + "_pos", &p->pos, &g->pos);
      out.emplace_back(n + "_w1", &p->w1, &g->w1);
      out.emplace_back(n + "_b1", &p->b1, &g->b1);
      out.emplace_back(n + "_w2", &p->w2, &g->w2);
      out.emplace_back(n + "_b2", &p->b2, &g->b2);
    }
  }
  return out;
}

class GradientTest : public ::testing::TestWithParam<NsaCase> {};

TEST_P(GradientTest, MatchesFiniteDifferences) {
  const NsaCase& c = GetParam();
  const NsaConfig cfg = make_config(c.shape, c.hyper, c.phi, c.kv);
  const SeqLayout layout = SeqLayout::packed(c.cu_seqlens, c.cu_seqlens.back());
  const int64_t T = layout.total_tokens();
  NsaTensors<double> in = random_nsa_inputs<double>(cfg, T, 5);
  NsaConfig do_cfg = cfg;
  do_cfg.dk = cfg.dv;
  const Tensor<double> d_o = random_nsa_inputs<double>(do_cfg, T, 6).q;
  const NsaForward<double> fwd = nsa_forward_cpu(cfg, layout, in);
  const NsaTensors<double> grad = nsa_backward_cpu(cfg, layout, in, fwd, d_o);

  std::mt19937_64 rng(7);
  const double h = 1e-6, atol = 1e-7, rtol = 1e-6;
  int skipped = 0, checked = 0;
  for (auto& [name, x, dx] : tensor_pairs(cfg, in, grad)) {
    ASSERT_EQ(x->shape, dx->shape) << name;
    double worst = 0;
    const int64_t samples = std::min<int64_t>(x->numel(), 40);
    for (int64_t s = 0; s < samples; ++s) {
      const int64_t i = x->numel() <= 40 ? s : static_cast<int64_t>(rng() % x->numel());
      const double saved = (*x)[i];
      Tensor<int32_t> sel_plus, sel_minus;
      (*x)[i] = saved + h;
      const double lp = loss(cfg, layout, in, d_o, &sel_plus);
      (*x)[i] = saved - h;
      const double lm = loss(cfg, layout, in, d_o, &sel_minus);
      (*x)[i] = saved;
      if (sel_plus.data != fwd.sel_idx.data || sel_minus.data != fwd.sel_idx.data) {
        ++skipped;
        continue;
      }
      const double fd = (lp - lm) / (2 * h), an = (*dx)[i];
      const double ratio = std::fabs(fd - an) / (atol + rtol * std::fabs(fd));
      worst = std::max(worst, ratio);
      EXPECT_LE(ratio, 1.0) << name << "[" << i << "]: finite difference " << fd << ", backward "
                            << an;
      ++checked;
    }
    std::printf("  d%-10s %3lld samples, headroom %.1fx\n", name.c_str(),
                static_cast<long long>(samples), worst > 0 ? 1 / worst : INFINITY);
  }
  std::printf("  %d checked, %d skipped (selection changed)\n", checked, skipped);
  EXPECT_LE(skipped, checked / 50) << "too many perturbations changed the selection";
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, GradientTest,
    ::testing::Values(
        // name, {H, G, dk, dv}, {l, d, l_sel, n_sel, w}, phi, kv, cu_seqlens
        NsaCase{"avg_gqa2_packed",
                {4, 2, 6, 5},
                {4, 2, 8, 4, 6},
                Phi::kAvg,
                KvMode::kSeparate,
                {0, 29, 31, 58}},
        NsaCase{"mlp_gqa3", {3, 1, 4, 6}, {4, 2, 4, 4, 5}, Phi::kMlp, KvMode::kSeparate, {0, 37}},
        NsaCase{
            "mlp_shared", {2, 2, 4, 4}, {4, 4, 8, 3, 9}, Phi::kMlp, KvMode::kShared, {0, 19, 45}},
        NsaCase{
            "avg_shared_mha", {2, 2, 5, 3}, {2, 1, 2, 5, 4}, Phi::kAvg, KvMode::kShared, {0, 33}}),
    [](const auto& info) { return std::string(info.param.name); });

// Gate activation: d(Σ dg·g)/dz against finite differences, for sigmoid and softmax.
TEST(GateActivation, MatchesFiniteDifferences) {
  for (GateActivation act : {GateActivation::kSigmoid, GateActivation::kSoftmax}) {
    std::mt19937_64 rng(3);
    std::normal_distribution<double> normal;
    Tensor<double> z[kNumBranches], dg[kNumBranches], g[kNumBranches], dz[kNumBranches];
    for (int c = 0; c < kNumBranches; ++c) {
      z[c] = Tensor<double>({5, 3});
      dg[c] = Tensor<double>({5, 3});
      for (auto& x : z[c].data) x = 2 * normal(rng);
      for (auto& x : dg[c].data) x = normal(rng);
    }
    gate_activation_forward(act, z, g);
    gate_activation_backward(act, g, dg, dz);
    for (int64_t i = 0; i < 15; ++i) {
      double sum = 0;
      for (int c = 0; c < kNumBranches; ++c) sum += g[c][i];
      if (act == GateActivation::kSoftmax) {
        EXPECT_NEAR(sum, 1.0, 1e-12);
      }
    }
    auto objective = [&] {
      Tensor<double> v[kNumBranches];
      gate_activation_forward(act, z, v);
      double s = 0;
      for (int c = 0; c < kNumBranches; ++c) {
        for (int64_t i = 0; i < 15; ++i) s += v[c][i] * dg[c][i];
      }
      return s;
    };
    for (int c = 0; c < kNumBranches; ++c) {
      for (int64_t i = 0; i < 15; ++i) {
        const double saved = z[c][i], h = 1e-6;
        z[c][i] = saved + h;
        const double lp = objective();
        z[c][i] = saved - h;
        const double lm = objective();
        z[c][i] = saved;
        EXPECT_NEAR(dz[c][i], (lp - lm) / (2 * h), 1e-8) << to_string(act) << " branch " << c;
      }
    }
  }
}

}  // namespace
}  // namespace nsa::test
