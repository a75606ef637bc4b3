// Sampling (see sampler.h).
#include "sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "nsa/error.h"

namespace nsa {

Sampler::Sampler(const SamplerConfig& cfg) : cfg_(cfg), rng_(cfg.seed) {
  check_finite_non_negative("--temperature", cfg.temperature);
  NSA_CHECK(cfg.top_k >= 0, "--top-k ", cfg.top_k, " must be >= 0");
  NSA_CHECK(cfg.top_p > 0 && cfg.top_p <= 1, "--top-p ", cfg.top_p, " must be in (0, 1]");
}

int32_t Sampler::sample(const std::vector<float>& logits) {
  const auto n = static_cast<int64_t>(logits.size());
  if (cfg_.temperature == 0) {
    return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  }
  std::vector<int32_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  int64_t keep = cfg_.top_k > 0 ? std::min(cfg_.top_k, n) : n;
  std::vector<double> p(static_cast<size_t>(keep));
  const double m = logits[order[0]];
  double sum = 0;
  for (int64_t i = 0; i < keep; ++i)
    sum += p[i] = std::exp((logits[order[i]] - m) / cfg_.temperature);
  double cum = 0;
  for (int64_t i = 0; i < keep; ++i) {  // nucleus: the smallest prefix with mass >= top_p
    cum += p[i] / sum;
    if (cum >= cfg_.top_p) {
      keep = i + 1;
      break;
    }
  }
  std::discrete_distribution<int64_t> pick(p.begin(), p.begin() + keep);
  return order[pick(rng_)];
}

}  // namespace nsa
