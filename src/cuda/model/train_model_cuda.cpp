// The GPU training backend (see train_model_cuda.h).
#include "train_model_cuda.h"

#include "device.h"
#include "model_cuda.h"

namespace nsa::cuda {
namespace {

class TrainModelCuda : public TrainModel {
 public:
  TrainModelCuda(const ModelConfig& cfg, const SeqLayout& layout, const AdamWConfig& adam,
                 bool recompute)
      : cfg_(cfg),
        adam_(adam),
        model_(cfg, layout, recompute),
        params_(init_model_params<float>(cfg)) {
    for (const auto& [name, t] : params_.named(cfg_)) {
      m_.emplace_back(t->shape);
      v_.emplace_back(t->shape);
    }
    model_.set_params(params_);  // the same seeded initialisation as the CPU backend
  }

  void zero_grads() override { model_.zero_grads(); }
  double forward_backward(const Batch& b, bool backward, ModelStats* stats) override {
    return model_.forward_backward(b.inputs, b.targets, backward, stats);
  }
  // Through host memory (the MPI communicator reads host buffers).
  void allreduce_grads(Communicator& comm) override {
    model_.download_grads_flat(flat_);
    comm.allreduce_sum(flat_.data(), static_cast<int64_t>(flat_.size()));
    model_.upload_grads_flat(flat_);
  }
  void shard_optimizer_state(Communicator&) override {
    throw Error(
        "--zero1: optimizer-state sharding runs on the CPU backend so far (not --device cuda)");
  }
  double optimizer_step(int64_t step, double grad_scale) override {
    return model_.optimizer_step(adam_, step, grad_scale);
  }
  NamedTensors named_params() override { return params_.named(cfg_); }
  std::vector<Tensor<float>>& adam_m() override { return m_; }
  std::vector<Tensor<float>>& adam_v() override { return v_; }
  void pull() override {
    model_.get_params(params_);
    model_.get_adam_state(m_, v_);
  }
  void push() override {
    model_.set_params(params_);
    model_.set_adam_state(m_, v_);
  }
  size_t device_bytes() const override { return model_.device_bytes(); }
  const char* device() const override { return "cuda"; }

 private:
  ModelConfig cfg_;
  AdamWConfig adam_;
  ModelCuda model_;
  ModelParams<float> params_;
  std::vector<Tensor<float>> m_, v_;
  std::vector<float> flat_;
};

}  // namespace

std::unique_ptr<TrainModel> make_train_model_cuda(const ModelConfig& cfg, const SeqLayout& layout,
                                                  const AdamWConfig& adam, bool recompute) {
  select_local_device();  // one GPU per rank of a node
  return std::make_unique<TrainModelCuda>(cfg, layout, adam, recompute);
}

}  // namespace nsa::cuda
