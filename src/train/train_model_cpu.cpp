// The CPU training backend (see train_model.h): model_loss_cpu and AdamW on host tensors.
#include <algorithm>
#include <memory>

#include "train_model.h"

namespace nsa {
namespace {

class TrainModelCpu : public TrainModel {
 public:
  TrainModelCpu(const ModelConfig& cfg, const SeqLayout& layout, const AdamWConfig& adam)
      : cfg_(cfg),
        layout_(layout),
        params_(init_model_params<float>(cfg)),
        grads_(zeros_like(cfg, params_)) {
    const auto named = params_.named(cfg_);
    const auto gnamed = grads_.named(cfg_);
    std::vector<Tensor<float>*> pptr;
    std::vector<bool> decay;
    for (size_t i = 0; i < named.size(); ++i) {
      pptr.push_back(named[i].second);
      gptr_.push_back(gnamed[i].second);
      decay.push_back(named[i].second->shape.size() == 2);  // matrices only
    }
    opt_ = std::make_unique<AdamW>(adam, pptr, decay);
  }

  void zero_grads() override {
    for (Tensor<float>* g : gptr_) g->fill(0.0f);
  }
  double forward_backward(const Batch& b, bool backward, ModelStats* stats) override {
    return model_loss_cpu<float>(cfg_, params_, layout_, b.inputs, b.targets,
                                 backward ? &grads_ : nullptr, stats);
  }
  void allreduce_grads(Communicator& comm) override {
    // One flat buffer: one collective per step instead of one per tensor.
    flat_.clear();
    for (const Tensor<float>* g : gptr_) flat_.insert(flat_.end(), g->data.begin(), g->data.end());
    comm.allreduce_sum(flat_.data(), static_cast<int64_t>(flat_.size()));
    size_t off = 0;
    for (Tensor<float>* g : gptr_) {
      std::copy(flat_.begin() + off, flat_.begin() + off + g->data.size(), g->data.begin());
      off += g->data.size();
    }
  }
  void shard_optimizer_state(Communicator& comm) override {
    int64_t total = 0;
    for (const auto& [name, t] : params_.named(cfg_)) total += t->numel();
    offsets_ = Communicator::even_ranges(total, comm.world());
    opt_->shard(offsets_[comm.rank()], offsets_[comm.rank() + 1]);
    zero_comm_ = &comm;
  }
  double optimizer_step(int64_t step, double grad_scale) override {
    if (grad_scale != 1.0) {
      const float s = static_cast<float>(grad_scale);
      for (Tensor<float>* g : gptr_) {
        for (float& x : g->data) x *= s;
      }
    }
    const double norm = opt_->step(step, gptr_);
    if (zero_comm_) {  // every rank updated its slice: gather the whole model
      flat_.clear();
      for (const auto& [name, t] : params_.named(cfg_))
        flat_.insert(flat_.end(), t->data.begin(), t->data.end());
      zero_comm_->allgather_ranges(flat_.data(), offsets_);
      size_t off = 0;
      for (const auto& [name, t] : params_.named(cfg_)) {
        std::copy(flat_.begin() + off, flat_.begin() + off + t->data.size(), t->data.begin());
        off += t->data.size();
      }
    }
    return norm;
  }
  NamedTensors named_params() override { return params_.named(cfg_); }
  std::vector<Tensor<float>>& adam_m() override { return opt_->m(); }
  std::vector<Tensor<float>>& adam_v() override { return opt_->v(); }
  void pull() override {
    if (zero_comm_) {
      opt_->materialize([this](std::vector<float>& flat) {
        zero_comm_->allgather_ranges(flat.data(), offsets_);
      });
    }
  }
  void push() override {}
  size_t device_bytes() const override { return 0; }
  const char* device() const override { return "cpu"; }

 private:
  ModelConfig cfg_;
  SeqLayout layout_;
  ModelParams<float> params_, grads_;
  std::vector<Tensor<float>*> gptr_;
  std::unique_ptr<AdamW> opt_;
  std::vector<float> flat_;
  Communicator* zero_comm_ = nullptr;  // ZeRO-1
  std::vector<int64_t> offsets_;       // ZeRO-1: rank r owns flat elements [offsets_[r], +1)
};

}  // namespace

std::unique_ptr<TrainModel> make_train_model_cpu(const ModelConfig& cfg, const SeqLayout& layout,
                                                 const AdamWConfig& adam, Recompute /*recompute*/) {
  return std::make_unique<TrainModelCpu>(cfg, layout, adam);
}

}  // namespace nsa
