// AdamW and the learning-rate schedule (see adamw.h).
#include "adamw.h"

#include <algorithm>
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
  if (sharded_) {  // materialized moments of a checkpoint are not kept
    for (auto* moments : {&m_, &v_}) {
      for (Tensor<float>& t : *moments) std::vector<float, TrackedAllocator<float>>().swap(t.data);
    }
  }
  int64_t off = 0;  // flat index of tensor i's first element
  for (size_t i = 0; i < params_.size(); ++i) {
    Tensor<float>& p = *params_[i];
    const Tensor<float>& g = *grads[i];
    const float wd = decay_[i] ? static_cast<float>(cfg_.weight_decay) : 0.0f;
    // Elements [j0, j1) of this tensor are ours; element j's moments are m[base + j], v[base + j].
    int64_t j0 = 0, j1 = p.numel(), base = 0;
    float* m = sharded_ ? shard_m_.data() : m_[i].ptr();
    float* v = sharded_ ? shard_v_.data() : v_[i].ptr();
    if (sharded_) {
      j0 = std::clamp(lo_ - off, int64_t{0}, p.numel());
      j1 = std::clamp(hi_ - off, int64_t{0}, p.numel());
      base = off - lo_;
    }
    for (int64_t j = j0; j < j1; ++j) {
      const float gj = g[j] * scale;
      float& mj = m[base + j];
      float& vj = v[base + j];
      mj = b1 * mj + (1 - b1) * gj;
      vj = b2 * vj + (1 - b2) * gj * gj;
      const float mhat = mj / bc1, vhat = vj / bc2;
      p[j] -= flr * (mhat / (std::sqrt(vhat) + eps) + wd * p[j]);
    }
    off += p.numel();
  }
  return norm;
}

void AdamW::shard(int64_t lo, int64_t hi) {
  NSA_CHECK(!sharded_ && 0 <= lo && lo <= hi, "AdamW::shard: bad range [", lo, ", ", hi, ")");
  shard_m_.assign(static_cast<size_t>(hi - lo), 0.0f);
  shard_v_.assign(static_cast<size_t>(hi - lo), 0.0f);
  int64_t off = 0;
  for (size_t i = 0; i < m_.size(); ++i) {
    for (int64_t j = 0; j < m_[i].numel(); ++j, ++off) {
      if (off >= lo && off < hi) shard_m_[off - lo] = m_[i][j], shard_v_[off - lo] = v_[i][j];
    }
    std::vector<float, TrackedAllocator<float>>().swap(m_[i].data);
    std::vector<float, TrackedAllocator<float>>().swap(v_[i].data);
  }
  sharded_ = true, lo_ = lo, hi_ = hi;
}

void AdamW::materialize(const std::function<void(std::vector<float>&)>& fill_rest) {
  NSA_CHECK(sharded_, "AdamW::materialize on an unsharded optimizer");
  for (auto [moments, shard] : {std::pair{&m_, &shard_m_}, std::pair{&v_, &shard_v_}}) {
    int64_t total = 0;
    for (const Tensor<float>* p : params_) total += p->numel();
    std::vector<float> flat(static_cast<size_t>(total), 0.0f);
    std::copy(shard->begin(), shard->end(), flat.begin() + lo_);
    fill_rest(flat);
    int64_t off = 0;
    for (size_t i = 0; i < params_.size(); ++i) {
      (*moments)[i] = Tensor<float>(params_[i]->shape);
      std::copy_n(flat.begin() + off, params_[i]->numel(), (*moments)[i].data.begin());
      off += params_[i]->numel();
    }
  }
}

}  // namespace nsa
