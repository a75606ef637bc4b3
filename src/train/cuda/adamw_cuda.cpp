// The GPU optimizer: AdamW and its ZeRO-1 shard (see adamw_cuda.h).
#include "adamw_cuda.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "adamw_kernel.h"
#include "cuda/common/cuda_check.h"
#include "nsa/error.h"

namespace nsa::cuda {

AdamWCuda::AdamWCuda(ModelCuda& model)
    : model_(model), params_(model.params()), stream_(model.stream()) {
  moment1_.resize(params_.flat_size());
  moment2_.resize(params_.flat_size());
  moment1_.zero(stream_);
  moment2_.zero(stream_);
  shard_hi_ = params_.flat_size();
}

void AdamWCuda::check_moments(const std::vector<Tensor<float>>& t) const {
  const auto& slots = params_.slots();
  NSA_CHECK(t.size() == slots.size(), "AdamW state: ", t.size(), " moments for ", slots.size(),
            " parameters");
  for (size_t i = 0; i < slots.size(); ++i) {
    NSA_CHECK(t[i].numel() == slots[i].numel, "AdamW state: moment ", i, " has the wrong size");
  }
}

// The moments go through a host buffer laid out as the parameter buffer: one copy of this rank's
// slice each way.
void AdamWCuda::set_state(const std::vector<Tensor<float>>& m,
                          const std::vector<Tensor<float>>& v) {
  check_moments(m);
  check_moments(v);
  const auto& slots = params_.slots();
  std::vector<float> flat(static_cast<size_t>(params_.flat_size()), 0.0f);
  for (auto [host, dev] : {std::pair{&m, &moment1_}, std::pair{&v, &moment2_}}) {
    for (size_t i = 0; i < slots.size(); ++i) {
      std::copy_n((*host)[i].ptr(), slots[i].numel, flat.begin() + slots[i].offset);
    }
    NSA_CUDA_CHECK(cudaMemcpyAsync(dev->get(), flat.data() + shard_lo_, dev->bytes(),
                                   cudaMemcpyHostToDevice, stream_));
    NSA_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
}

void AdamWCuda::get_state(std::vector<Tensor<float>>& m, std::vector<Tensor<float>>& v,
                          const GatherFlat& gather) {
  const bool sharded = shard_lo_ != 0 || shard_hi_ != params_.flat_size();
  NSA_CHECK(!sharded || gather, "AdamW state of a sharded optimizer: the other ranks' slices ",
            "need a gather");
  check_moments(m);
  check_moments(v);
  const auto& slots = params_.slots();
  for (auto [host, dev] : {std::pair{&m, &moment1_}, std::pair{&v, &moment2_}}) {
    std::vector<float> flat(static_cast<size_t>(params_.flat_size()), 0.0f);
    NSA_CUDA_CHECK(cudaMemcpyAsync(flat.data() + shard_lo_, dev->get(), dev->bytes(),
                                   cudaMemcpyDeviceToHost, stream_));
    NSA_CUDA_CHECK(cudaStreamSynchronize(stream_));
    if (sharded) gather(flat);
    for (size_t i = 0; i < slots.size(); ++i) {
      std::copy_n(flat.begin() + slots[i].offset, slots[i].numel, (*host)[i].ptr());
    }
  }
}

void AdamWCuda::shard(int64_t lo, int64_t hi) {
  NSA_CHECK(shard_lo_ <= lo && lo <= hi && hi <= shard_hi_, "optimizer shard [", lo, ", ", hi,
            ") is not inside the elements held [", shard_lo_, ", ", shard_hi_, ")");
  for (DeviceBuffer<float>* dev : {&moment1_, &moment2_}) {
    DeviceBuffer<float> slice(hi - lo);
    if (hi > lo) {
      NSA_CUDA_CHECK(cudaMemcpyAsync(slice.get(), dev->get() + (lo - shard_lo_), slice.bytes(),
                                     cudaMemcpyDeviceToDevice, stream_));
    }
    NSA_CUDA_CHECK(cudaStreamSynchronize(stream_));
    *dev = std::move(slice);
  }
  shard_lo_ = lo, shard_hi_ = hi;
}

void AdamWCuda::download_weight_slice(std::vector<float>& flat) {
  params_.download_weights_range(shard_lo_, shard_hi_, flat);
}

double AdamWCuda::step(const AdamWConfig& adam, int64_t step, double grad_scale) {
  model_.phase_timer().mark(StepPhase::kOptimizer, stream_);
  const float sq = model_.grad_sum_of_squares();
  const double norm = std::sqrt(static_cast<double>(sq)) * grad_scale;
  const double clip = adam.clip > 0 && norm > adam.clip ? adam.clip / norm : 1.0;
  const double t = static_cast<double>(step + 1);
  AdamWScalars s{};
  s.lr = static_cast<float>(lr_at(adam, step));
  s.beta1 = static_cast<float>(adam.beta1);
  s.beta2 = static_cast<float>(adam.beta2);
  s.bc1 = static_cast<float>(1.0 - std::pow(adam.beta1, t));
  s.bc2 = static_cast<float>(1.0 - std::pow(adam.beta2, t));
  s.eps = static_cast<float>(adam.eps);
  s.g_scale = static_cast<float>(grad_scale * clip);
  for (const ModelParamsCuda::Slot& slot : params_.slots()) {  // the part inside this rank's slice
    const int64_t a = std::max(slot.offset, shard_lo_);
    const int64_t b = std::min(slot.offset + slot.numel, shard_hi_);
    if (a >= b) continue;
    s.weight_decay = slot.decay ? static_cast<float>(adam.weight_decay) : 0.0f;
    launch_adamw(params_.weights_flat() + a, params_.weights_bf16_flat() + a,
                 params_.grads_flat() + a, moment1_.get() + (a - shard_lo_),
                 moment2_.get() + (a - shard_lo_), b - a, s, stream_);
  }
  return norm;
}

}  // namespace nsa::cuda
