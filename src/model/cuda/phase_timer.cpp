// CUDA-event phase timing of a training step (see phase_timer.h).
#include "phase_timer.h"

#include "cuda/common/cuda_check.h"

namespace nsa::cuda {

PhaseTimer::~PhaseTimer() {
  for (cudaEvent_t e : events_) cudaEventDestroy(e);
}

void PhaseTimer::set_enabled(bool on) {
  enabled_ = on;
  used_ = 0;
  current_ = StepPhase::kCount;
}

void PhaseTimer::record(StepPhase phase, cudaStream_t stream) {
  if (used_ == events_.size()) {
    cudaEvent_t e = nullptr;
    NSA_CUDA_CHECK(cudaEventCreate(&e));
    events_.push_back(e);
    phases_.push_back(phase);
  }
  phases_[used_] = phase;
  NSA_CUDA_CHECK(cudaEventRecord(events_[used_], stream));
  ++used_;
  current_ = phase;
}

bool PhaseTimer::collect(StepPhaseTimes& out) {
  if (used_ == 0) return false;
  NSA_CUDA_CHECK(cudaEventSynchronize(events_[used_ - 1]));
  for (size_t i = 0; i + 1 < used_; ++i) {
    if (phases_[i] == StepPhase::kCount) continue;  // a stop(): nothing open until the next mark
    float ms = 0;
    NSA_CUDA_CHECK(cudaEventElapsedTime(&ms, events_[i], events_[i + 1]));
    out[phases_[i]] += ms;
  }
  used_ = 0;
  current_ = StepPhase::kCount;
  return true;
}

}  // namespace nsa::cuda
