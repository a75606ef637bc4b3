// `nsa train`: the training loop around a model backend, CPU or GPU (docs/training.md,
// train_model.h), in one process or as one rank of a data-parallel run.
//
// Per step: gradient accumulation over micro-batches, a non-finite-loss stop, AdamW with clipping
// and warm-up + cosine, one console line and one JSON line (metrics.jsonl), a heartbeat file;
// validation loss/perplexity every `val_every` steps; atomic checkpoints every `ckpt_every` steps
// and at the end; `resume` continues bit-exactly from the newest complete checkpoint. A watchdog
// turns a stalled step into an exit with every thread's stack; SIGUSR1 dumps stacks any time.
#pragma once

#include <cmath>
#include <cstdint>
#include <map>
#include <string>

#include "adamw.h"
#include "model/model_params.h"
#include "train_model.h"

namespace nsa {

struct TrainOptions {
  std::string config = "configs/tiny.yaml";
  std::map<std::string, std::string> overrides;  // model/attention fields
  std::string data = "synthetic";                // shard folder or "synthetic"
  std::string out_dir = "runs/tiny";
  int64_t steps = 200, batch = 4, seq_len = 0, grad_accum = 1;
  AdamWConfig adam;
  int64_t val_every = 50, val_batches = 4, ckpt_every = 100, keep = 3;
  bool resume = false;
  bool overwrite = false;  // a fresh run may replace the run already in out_dir
  // Start from these weights (a checkpoint folder, or a run folder's newest checkpoint) with a
  // fresh optimizer at step 0 – a second stage of a curriculum, or fine-tuning. The model config
  // must match but for `branches`. Ignored when --resume finds a checkpoint in out_dir (the stage
  // is resumed).
  std::string init_from;
  bool anomaly = false;     // check every activation and gradient for NaN/Inf, name the first
  double watchdog_s = 600;  // a step stalled this long: stacks to <out>/stacks.txt, exit 3; 0: off
  int64_t stop_after = 0;   // stop (with a checkpoint) after this many steps in this run; 0 = never
  bool quiet = false;       // no console lines (tests)
  Recompute recompute = Recompute::kNone;  // GPU model: what the backward recomputes
  // The model backend; empty: the CPU reference. `nsa train --device cuda` sets the GPU one.
  TrainModelFactory model_factory;
  // The ranks of a data-parallel run (dist/communicator.h); null: one process. Each rank takes its
  // own B sequences of every global batch of world·B, gradients and losses are summed over the
  // ranks each step, rank 0 writes metrics, plots and checkpoints.
  Communicator* comm = nullptr;
  bool zero1 = false;  // shard the AdamW moments over the ranks (ZeRO stage 1)
  // Failure injection for the multi-rank tests: at step fault_step, rank fault_rank exits with
  // code 17 (fault = "exit") or stops making progress (fault = "stall").
  std::string fault;
  int fault_rank = -1;
  int64_t fault_step = 0;
};

struct TrainResult {
  int64_t start = 0;       // the step a resumed run continued from (0: from the start)
  int64_t steps_done = 0;  // the last step run (0: none)
  double last_loss = 0;
  double last_val_loss = std::nan("");  // NaN: no validation ran
};

TrainResult train(const TrainOptions& options);

// Mean loss over the first `batches` batches of the validation split of `data`.
double validation_loss(const ModelConfig& cfg, const ModelParams<float>& params,
                       const std::string& data, int64_t batches, int64_t batch, int64_t seq_len);

// A model rebuilt from a checkpoint: its own config, its weights, its step.
struct LoadedModel {
  ModelConfig cfg;
  ModelParams<float> params;
  int64_t step = 0;
};
LoadedModel load_model_checkpoint(const std::string& checkpoint);

struct EvalResult {
  double loss = 0, ppl = 0;
  int64_t step = 0, tokens = 0;
  int64_t batches = 0;  // evaluated: the asked number, or fewer where the split holds fewer
};
// Loads a checkpoint (its own config and weights) and evaluates it on `data`'s validation split:
// `batches` batches, at most the split's distinct ones (no token counted twice).
EvalResult evaluate_checkpoint(const std::string& checkpoint, const std::string& data,
                               int64_t batches, int64_t batch, int64_t seq_len);

}  // namespace nsa
