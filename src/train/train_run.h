// The set-up of `nsa train` (train_run.cpp): the config and its overrides, the ranks and their
// agreement, the model backend, the training data, and where the run starts (a resumed checkpoint
// or --init-from weights). Everything the step loop (train_step.h) and the periodic work
// (train_periodic.h) read.
#pragma once

#include <cstdint>
#include <memory>

#include "dist/communicator.h"
#include "run_folder.h"
#include "token_loader.h"
#include "train_model.h"
#include "trainer.h"

namespace nsa {

struct TrainRun {
  RunFolder folder;  // rank 0: this run is the folder's one writer (released last)
  std::unique_ptr<Communicator> local;  // set when the options bring no communicator
  Communicator* comm = nullptr;
  int rank = 0, world = 1;
  bool lead = true;  // rank 0: writes metrics, plots and checkpoints
  ModelConfig cfg;
  int64_t seq_len = 0;  // S: the option, else the config's
  AdamWConfig adam;     // the options' AdamW with total_steps = steps
  std::unique_ptr<TrainModel> model;
  bool on_cpu = true;
  NamedTensors named;  // the model's host parameters, checkpoint order
  std::unique_ptr<TokenLoader> loader;
  int64_t start = 0;  // the first step to run
};

// Validates the options, checks that every rank got the same ones, builds the model and the
// loader, resumes or initialises, and shards the optimizer for ZeRO-1.
TrainRun set_up_run(const TrainOptions& o);

// The inputs of rank r: sequences [r·B, (r+1)·B) of a global batch; `tokens` = B·S.
Batch rank_slice(const Batch& global, int rank, int64_t tokens);

}  // namespace nsa
