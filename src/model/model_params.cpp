// Model parameters: names, initialisation (see model_params.h).
#include "model_params.h"

#include <cmath>
#include <random>

namespace nsa {

template <typename Real>
std::vector<std::pair<std::string, Tensor<Real>*>> ModelParams<Real>::named(
    const ModelConfig& cfg) {
  std::vector<std::pair<std::string, Tensor<Real>*>> out;
  out.emplace_back("tok_embeddings.weight", &tok_emb);
  for (size_t i = 0; i < layers.size(); ++i) {
    LayerParams<Real>& L = layers[i];
    const std::string p = "layers." + std::to_string(i) + ".";
    out.emplace_back(p + "attention_norm.weight", &L.attn_norm);
    out.emplace_back(p + "attention.wq.weight", &L.wq);
    for (int c = 0; c < kNumBranches; ++c) {
      if (cfg.attn.kv_index(c) != c) continue;
      const std::string suffix =
          cfg.attn.kv == KvMode::kShared ? "" : std::string("_") + kBranchNames[c];
      out.emplace_back(p + "attention.wk" + suffix + ".weight", &L.wk[c]);
      out.emplace_back(p + "attention.wv" + suffix + ".weight", &L.wv[c]);
    }
    out.emplace_back(p + "attention.wg.weight", &L.wg);
    out.emplace_back(p + "attention.wg.bias", &L.bg);
    out.emplace_back(p + "attention.wo.weight", &L.wo);
    if (cfg.attn.phi == Phi::kMlp) {
      for (auto [name, phi] : {std::pair{"phi_k", &L.phi_k}, std::pair{"phi_v", &L.phi_v}}) {
        const std::string q = p + "attention." + name + ".";
        out.emplace_back(q + "pos", &phi->pos);
        out.emplace_back(q + "w1", &phi->w1);
        out.emplace_back(q + "b1", &phi->b1);
        out.emplace_back(q + "w2", &phi->w2);
        out.emplace_back(q + "b2", &phi->b2);
      }
    }
    out.emplace_back(p + "ffn_norm.weight", &L.ffn_norm);
    out.emplace_back(p + "feed_forward.w1.weight", &L.w1);
    out.emplace_back(p + "feed_forward.w2.weight", &L.w2);
    if (cfg.mlp == "swiglu") out.emplace_back(p + "feed_forward.w3.weight", &L.w3);
  }
  out.emplace_back("norm.weight", &norm);
  if (!cfg.tie_embeddings) out.emplace_back("output.weight", &output);
  return out;
}

template <typename Real>
ModelParams<Real> init_model_params(const ModelConfig& cfg) {
  cfg.validate();
  const NsaConfig& a = cfg.attn;
  const int64_t D = cfg.dim, F = cfg.ffn_hidden(), H = a.heads, G = a.groups;
  std::mt19937_64 rng(cfg.seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  auto randn = [&](Shape shape, double std) {
    Tensor<Real> t(std::move(shape));
    for (auto& x : t.data) x = static_cast<Real>(std * normal(rng));
    return t;
  };
  const double s = cfg.init_std, s_res = cfg.init_std / std::sqrt(2.0 * cfg.n_layers);
  ModelParams<Real> p;
  p.tok_emb = randn({cfg.vocab_size, D}, s);
  for (int64_t i = 0; i < cfg.n_layers; ++i) {
    LayerParams<Real> L;
    L.attn_norm = Tensor<Real>({D}, Real(1));
    L.wq = randn({H * a.dk, D}, s);
    for (int c = 0; c < kNumBranches; ++c) {
      if (a.kv_index(c) != c) continue;
      L.wk[c] = randn({G * a.dk, D}, s);
      L.wv[c] = randn({G * a.dv, D}, s);
    }
    L.wg = randn({3 * H, D}, s);
    L.bg = Tensor<Real>({3 * H});
    L.wo = randn({D, H * a.dv}, s_res);
    if (a.phi == Phi::kMlp) {
      const int64_t hid = a.mlp_hidden();
      for (auto [phi, dd] : {std::pair{&L.phi_k, a.dk}, std::pair{&L.phi_v, a.dv}}) {
        phi->pos = randn({a.l, dd}, s);
        phi->w1 = randn({a.l * dd, hid}, 1.0 / std::sqrt(static_cast<double>(a.l * dd)));
        phi->b1 = Tensor<Real>({hid});
        phi->w2 = randn({hid, dd}, 1.0 / std::sqrt(static_cast<double>(hid)));
        phi->b2 = Tensor<Real>({dd});
      }
    }
    L.ffn_norm = Tensor<Real>({D}, Real(1));
    L.w1 = randn({F, D}, s);
    L.w2 = randn({D, F}, s_res);
    if (cfg.mlp == "swiglu") L.w3 = randn({F, D}, s);
    p.layers.push_back(std::move(L));
  }
  p.norm = Tensor<Real>({D}, Real(1));
  if (!cfg.tie_embeddings) p.output = randn({cfg.vocab_size, D}, s);
  return p;
}

template <typename Real>
ModelParams<Real> zeros_like(const ModelConfig& cfg, ModelParams<Real>& params) {
  ModelParams<Real> z;
  z.layers.resize(params.layers.size());
  auto src = params.named(cfg);
  auto dst = z.named(cfg);
  for (size_t i = 0; i < src.size(); ++i) *dst[i].second = Tensor<Real>(src[i].second->shape);
  return z;
}

template struct ModelParams<float>;
template struct ModelParams<double>;
template ModelParams<float> init_model_params<float>(const ModelConfig&);
template ModelParams<double> init_model_params<double>(const ModelConfig&);
template ModelParams<float> zeros_like<float>(const ModelConfig&, ModelParams<float>&);
template ModelParams<double> zeros_like<double>(const ModelConfig&, ModelParams<double>&);

}  // namespace nsa
