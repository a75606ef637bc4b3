// Where a training step's GPU time goes (nsa/step_phases.h): CUDA events recorded on the model's
// stream at every change of phase, read after the step. Off by default – marking then costs one
// branch and records nothing, so normal training has no extra events or synchronisations; `nsa
// bench train` turns it on for its breakdown steps.
//
// Each event opens a phase and closes the one before, so the phases tile the span from the
// first mark to stop() exactly: their sum is that span (host gaps the GPU waits through count
// towards the phase that is open).
#pragma once

#include <cuda_runtime.h>

#include <vector>

#include "nsa/step_phases.h"

namespace nsa::cuda {

class PhaseTimer {
 public:
  PhaseTimer() = default;
  ~PhaseTimer();
  PhaseTimer(const PhaseTimer&) = delete;
  PhaseTimer& operator=(const PhaseTimer&) = delete;

  // Turning it off (or on) drops the marks not collected yet.
  void set_enabled(bool on);
  bool enabled() const { return enabled_; }
  // From here on the stream's work belongs to `phase` (nothing when off or already in it).
  void mark(StepPhase phase, cudaStream_t stream) {
    if (enabled_ && phase != current_) record(phase, stream);
  }
  // Closes the open phase (the end of a step).
  void stop(cudaStream_t stream) {
    if (enabled_ && current_ != StepPhase::kCount) record(StepPhase::kCount, stream);
  }
  // Waits for the last mark and adds each closed phase's time into `out`; starts over. Returns
  // false (and adds nothing) when nothing was marked.
  bool collect(StepPhaseTimes& out);

 private:
  void record(StepPhase phase, cudaStream_t stream);

  bool enabled_ = false;
  StepPhase current_ = StepPhase::kCount;  // kCount: none open
  std::vector<cudaEvent_t> events_;        // a pool, reused from step to step
  std::vector<StepPhase> phases_;          // the phase each used event opened
  size_t used_ = 0;
};

}  // namespace nsa::cuda
