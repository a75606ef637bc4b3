// One optimizer step of `nsa train` (train_step.cpp): the micro-batches of this rank's slice of
// the global batch, the gradient all-reduce across ranks, the non-finite-loss stop and the AdamW
// step. What it reports feeds the periodic work (train_periodic.h).
#pragma once

#include <cstdint>

#include "train_run.h"

namespace nsa {

class RunMonitor;

struct StepResult {
  double loss = 0;       // mean over micro-batches and ranks
  double grad_norm = 0;  // before clipping
  double ms = 0;         // wall time of the step
  double tokens_per_s = 0;
  ModelStats stats;  // of this rank's last micro-batch
};

StepResult run_step(const TrainOptions& o, TrainRun& run, RunMonitor& monitor, int64_t step);

}  // namespace nsa
