// The periodic work of `nsa train` (train_periodic.cpp): the watchdog and the ranks' heartbeats,
// and after every step the metrics line, validation, the console line and checkpoints; the loss
// plot at the end.
#pragma once

#include <cstdint>
#include <fstream>

#include "train_run.h"
#include "train_step.h"
#include "watchdog.h"

namespace nsa {

class RunMonitor {
 public:
  RunMonitor(const TrainOptions& o, const TrainRun& run);

  // The step now running (heartbeats name it).
  void set_step(int64_t step) { step_ = step; }
  // Progress within the step: the watchdog, and with several ranks this rank's heartbeat file
  // (step and phase), so a watchdog that fires in a collective can name the rank that is behind.
  // `phase` must be a string literal.
  void progress(const char* phase);

  // After step `step`: the metrics line (with validation when due), the heartbeat, the console
  // line, and a checkpoint when due. Returns true when the run stops here (--stop-after).
  bool after_step(TrainRun& run, int64_t step, const StepResult& s, TrainResult& r);
  // At the end: the loss plot.
  void finish(const TrainRun& run);

 private:
  const TrainOptions& o_;
  int rank_, world_;
  int64_t step_ = 0;
  Watchdog watchdog_;
  std::ofstream metrics_;  // rank 0 only
};

// Mean validation loss through a training backend: the same global batches of world·B sequences
// as one process with batch world·B would see, each rank taking its slice.
double validation_loss(TrainModel& model, Communicator& comm, const ModelConfig& cfg,
                       const std::string& data, int64_t batches, int64_t batch, int64_t S);

}  // namespace nsa
