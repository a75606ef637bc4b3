// Everything a training run reads is checked before its first step: every option against its
// allowed range (a typo is an error naming the flag, never a silent default, a negative loop or
// an invalid metrics line), the sizes of a batch against this machine's memory, and both data
// splits – a missing, damaged or out-of-vocabulary validation shard fails at start-up, not at
// the first validation step.
#pragma once

#include <cstdint>

#include "train_run.h"
#include "trainer.h"

namespace nsa {

// The options against their ranges, and the batch's sizes (S: --seq-len or the config's).
void check_run_options(const TrainOptions& o, const ModelConfig& cfg, int64_t seq_len, int world);

// The data of both splits: readable, in the vocabulary, at least one global batch long.
void check_run_data(const TrainOptions& o, const TrainRun& run);

}  // namespace nsa
