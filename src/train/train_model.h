// What the training loop needs from a model backend – the CPU reference (train_model_cpu.cpp) or
// one GPU (src/train/cuda/train_model_cuda.h) – so that one loop drives both: micro-batch
// losses and gradients, the AdamW step, and host copies of weights and moments for checkpoints.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "adamw.h"
#include "checkpoint.h"
#include "dist/communicator.h"
#include "model/model_cpu.h"
#include "nsa/recompute.h"
#include "nsa/step_phases.h"
#include "token_loader.h"

namespace nsa {

class TrainModel {
 public:
  virtual ~TrainModel() = default;
  virtual void zero_grads() = 0;
  // Mean loss of one micro-batch; with `backward` its gradients are added to the accumulators.
  virtual double forward_backward(const Batch& batch, bool backward, ModelStats* stats) = 0;
  // Sums the accumulated gradients over the ranks of `comm` (every parameter, in one fixed order).
  virtual void allreduce_grads(Communicator& comm) = 0;
  // Called before the step's last forward_backward on every rank: a backend may start summing the
  // gradients over `comm` during that backward, part by part as they become final; allreduce_grads
  // then completes the sum. Does nothing by default.
  virtual void begin_gradient_sum(Communicator& comm) {}
  // ZeRO-1: from now on this rank keeps AdamW moments for its 1/world slice of the parameters
  // only, updates that slice and all-gathers the weights after each step. Call after a resume.
  virtual void shard_optimizer_state(Communicator& comm) = 0;
  // One AdamW update on the accumulated gradients times grad_scale; the pre-clip gradient norm.
  virtual double optimizer_step(int64_t step, double grad_scale) = 0;
  // Host tensors holding the weights and the AdamW moments (named order). pull() refreshes them
  // from the backend before a checkpoint is written; push() sends them after one was loaded.
  virtual NamedTensors named_params() = 0;
  virtual std::vector<Tensor<float>>& adam_m() = 0;
  virtual std::vector<Tensor<float>>& adam_v() = 0;
  virtual void pull() = 0;
  virtual void push() = 0;
  // Bytes the backend holds on its device (0 for the CPU, whose memory is in host_memory_stats).
  virtual size_t device_bytes() const = 0;
  // "cpu" or "cuda".
  virtual const char* device() const = 0;
  // Phase timing of the steps that follow (nsa/step_phases.h; `nsa bench train`): on, each step
  // from zero_grads to the end of optimizer_step is cut into phases; take_phase_times adds the
  // phases since the last call into `out` (waiting for the device). A backend that cannot time
  // its phases (the CPU) returns false.
  virtual void time_phases(bool on) {}
  virtual bool take_phase_times(StepPhaseTimes& out) { return false; }
};

// Builds the backend for a run: model config, micro-batch layout, optimizer config, whether to
// what the backward recomputes (nsa/recompute.h; the CPU keeps everything).
using TrainModelFactory = std::function<std::unique_ptr<TrainModel>(
    const ModelConfig&, const SeqLayout&, const AdamWConfig&, Recompute)>;

// The CPU reference backend (model_loss_cpu + AdamW on host tensors).
std::unique_ptr<TrainModel> make_train_model_cpu(const ModelConfig& cfg, const SeqLayout& layout,
                                                 const AdamWConfig& adam, Recompute recompute);

}  // namespace nsa
