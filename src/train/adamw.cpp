// AdamW and the learning-rate schedule (see adamw.h).
#include "adamw.h"

#include <cmath>

#include "nsa/error.h"

namespace nsa {

double lr_at(const AdamWConfig& c, int64_t step) {
  if (step < c.warmup) return c.lr * static_cast<double>(step + 1) / static_cast<double>(c.warmup);
  const double span = static_cast<double>(std::max<int64_t>(1, c.total_steps - c.warmup));
  const double progress = std::min(1.0, static_cast<double>(step - c.warmup) / span);
  return c.min_lr + 0.5 * (c.lr - c.min_lr) * (1.0 + std::cos(M_PI * progress));
}

AdamW::AdamW(const AdamWConfig& cfg, const std::vector<Tensor<float>*>& params,
             const std::vector<bool>& decay)
    : cfg_(cfg), params_(params), decay_(decay) {
  NSA_CHECK(params.size() == decay.size(), "AdamW: one decay flag per parameter");
  for (const Tensor<float>* p : params) {
    m_.emplace_back(p->shape);
    v_.emplace_back(p->shape);
  }
}

double AdamW::step(int64_t step, const std::vector<Tensor<float>*>& grads) {
  NSA_CHECK(grads.size() == params_.size(), "AdamW: ", grads.size(), " gradients for ",
            params_.size(), " parameters");
  double sq = 0;
  for (const Tensor<float>* g : grads) {
    for (float x : g->data) sq += static_cast<double>(x) * x;
  }
  const double norm = std::sqrt(sq);
  const float scale =
      cfg_.clip > 0 && norm > cfg_.clip ? static_cast<float>(cfg_.clip / norm) : 1.0f;
  const double lr = lr_at(cfg_, step);
  const double t = static_cast<double>(step + 1);
  const float bc1 = static_cast<float>(1.0 - std::pow(cfg_.beta1, t));
  const float bc2 = static_cast<float>(1.0 - std::pow(cfg_.beta2, t));
  const float b1 = static_cast<float>(cfg_.beta1), b2 = static_cast<float>(cfg_.beta2);
  const float eps = static_cast<float>(cfg_.eps), flr = static_cast<float>(lr);
  for (size_t i = 0; i < params_.size(); ++i) {
    Tensor<float>& p = *params_[i];
    const Tensor<float>& g = *grads[i];
    const float wd = decay_[i] ? static_cast<float>(cfg_.weight_decay) : 0.0f;
    for (int64_t j = 0; j < p.numel(); ++j) {
      const float gj = g[j] * scale;
      m_[i][j] = b1 * m_[i][j] + (1 - b1) * gj;
      v_[i][j] = b2 * v_[i][j] + (1 - b2) * gj * gj;
      const float mhat = m_[i][j] / bc1, vhat = v_[i][j] / bc2;
      p[j] -= flr * (mhat / (std::sqrt(vhat) + eps) + wd * p[j]);
    }
  }
  return norm;
}

}  // namespace nsa
