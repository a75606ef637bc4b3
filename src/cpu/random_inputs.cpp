// Reproducible random NSA inputs (see random_nsa_inputs in nsa/attention.h).
#include <cmath>
#include <random>

#include "nsa/attention.h"

namespace nsa {

template <typename Real>
NsaTensors<Real> random_nsa_inputs(const NsaConfig& cfg, int64_t T, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  auto randn = [&](Shape shape, double stddev) {
    Tensor<Real> t(std::move(shape));
    for (auto& x : t.data) x = static_cast<Real>(stddev * normal(rng));
    return t;
  };
  NsaTensors<Real> in;
  in.q = randn({T, cfg.heads, cfg.dk}, 1.0);
  for (int c = 0; c < kNumBranches; ++c) {
    if (cfg.kv_index(c) == c) {
      in.k[c] = randn({T, cfg.groups, cfg.dk}, 1.0);
      in.v[c] = randn({T, cfg.groups, cfg.dv}, 1.0);
    }
    in.gate[c] = randn({T, cfg.heads}, 1.0);
    for (auto& x : in.gate[c].data) x = Real(1) / (Real(1) + std::exp(-x));
  }
  if (cfg.phi == Phi::kMlp) {
    const int64_t hid = cfg.mlp_hidden();
    for (auto [p, D] :
         {std::pair<PhiMlpParams<Real>*, int64_t>{&in.phi_k, cfg.dk}, {&in.phi_v, cfg.dv}}) {
      p->pos = randn({cfg.l, D}, 0.1);
      p->w1 = randn({cfg.l * D, hid}, 1.0 / std::sqrt(static_cast<double>(cfg.l * D)));
      p->b1 = randn({hid}, 0.1);
      p->w2 = randn({hid, D}, 1.0 / std::sqrt(static_cast<double>(hid)));
      p->b2 = randn({D}, 0.1);
    }
  }
  return in;
}

template NsaTensors<float> random_nsa_inputs<float>(const NsaConfig&, int64_t, uint64_t);
template NsaTensors<double> random_nsa_inputs<double>(const NsaConfig&, int64_t, uint64_t);

}  // namespace nsa
