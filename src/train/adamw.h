// AdamW with fp32 master weights and moments, the learning-rate schedule and gradient clipping.
//
// Update per element (decoupled weight decay on matrices only, not on norms, biases or the gate
// bias – the usual practice): m = β1·m + (1−β1)·g; v = β2·v + (1−β2)·g²;
// p -= lr·(m/(1−β1^t) / (sqrt(v/(1−β2^t)) + eps) + wd·p).
// Schedule: linear warm-up from 0 to lr over `warmup` steps, then cosine decay to min_lr.
// Sharded (ZeRO-1) or not, every element goes through the same arithmetic, so a sharded run's
// weights are bit-identical to an unsharded one's.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "nsa/tensor.h"

namespace nsa {

struct AdamWConfig {
  double lr = 3e-3, min_lr = 3e-4;
  int64_t warmup = 20, total_steps = 1000;
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1;
  double clip = 1.0;  // global grad-norm clip; 0 disables
};

// Learning rate at (0-based) step.
double lr_at(const AdamWConfig& c, int64_t step);

class AdamW {
 public:
  // One moment pair per parameter; `decay[i]` says whether parameter i gets weight decay.
  AdamW(const AdamWConfig& cfg, const std::vector<Tensor<float>*>& params,
        const std::vector<bool>& decay);
  // Applies one update at `step` with the gradients scaled to the clip norm (the gradient tensors
  // themselves are not modified); returns the pre-clip global gradient norm.
  double step(int64_t step, const std::vector<Tensor<float>*>& grads);
  std::vector<Tensor<float>>& m() { return m_; }
  std::vector<Tensor<float>>& v() { return v_; }

  // ZeRO-1: keep (and update) only the elements [lo, hi) of the parameters laid end to end in
  // order; the moments of the rest are dropped. m()/v() are empty until materialize().
  void shard(int64_t lo, int64_t hi);
  bool sharded() const { return sharded_; }
  // Full-size m()/v() again for a checkpoint: this shard's values, and zeros elsewhere for
  // `fill_rest` (the caller gathers the other ranks' parts). Freed by the next step().
  void materialize(const std::function<void(std::vector<float>&)>& fill_rest);

 private:
  AdamWConfig cfg_;
  std::vector<Tensor<float>*> params_;
  std::vector<bool> decay_;
  std::vector<Tensor<float>> m_, v_;
  bool sharded_ = false;
  int64_t lo_ = 0, hi_ = 0;
  std::vector<float> shard_m_, shard_v_;
};

}  // namespace nsa
