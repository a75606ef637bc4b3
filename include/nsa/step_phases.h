// The phases of one training step, as `nsa bench train` reports them (docs/perf.md, "Training
// step"): where the step's time goes, measured on the GPU with CUDA events around the existing
// launches (cuda/common/phase_timer.h). Plain data here, so that the formatter and its test need
// no GPU.
#pragma once

#include <array>

namespace nsa {

enum class StepPhase : int {
  kAttentionForward = 0,  // the NSA layer's forward (compression, three branches, selection)
  kAttentionBackward,     // the NSA layer's backward
  kGemmForward,           // the model's projections and MLP GEMMs, forward (recompute included)
  kGemmBackward,          // their input- and weight-gradient GEMMs
  kElementwise,           // norms, RoPE, gates, SwiGLU, conversions, reductions, embedding
  kLmHeadLoss,            // the LM head GEMMs (forward and backward) and the cross-entropy
  kOptimizer,             // gradient norm and AdamW
  kCommunication,         // the gradient all-reduce and ZeRO-1's gather (0 on one GPU)
  kOther,                 // uploads, host work the GPU waits for, the loss read-back
  kCount
};
constexpr int kNumStepPhases = static_cast<int>(StepPhase::kCount);

// Table labels and JSON keys, in enum order.
constexpr std::array<const char*, kNumStepPhases> kStepPhaseNames = {
    "attention forward", "attention backward", "GEMM forward",  "GEMM backward", "element-wise",
    "LM head + loss",    "optimizer",          "communication", "other"};
constexpr std::array<const char*, kNumStepPhases> kStepPhaseKeys = {
    "attention_forward", "attention_backward", "gemm_forward",  "gemm_backward", "elementwise",
    "lm_head_loss",      "optimizer",          "communication", "other"};
static_assert(kStepPhaseNames.size() == kStepPhaseKeys.size());

// Milliseconds per phase (of one step, or summed over several).
struct StepPhaseTimes {
  std::array<double, kNumStepPhases> ms{};
  double& operator[](StepPhase p) { return ms[static_cast<int>(p)]; }
  double operator[](StepPhase p) const { return ms[static_cast<int>(p)]; }
  double total() const {
    double s = 0;
    for (double x : ms) s += x;
    return s;
  }
};

}  // namespace nsa
