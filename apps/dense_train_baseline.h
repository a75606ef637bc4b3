// The dense PyTorch baseline of `nsa bench train` (docs/training.md, "Benchmark"):
// bench/dense_model_train.py – our model's shape with dense cuDNN attention in plain PyTorch –
// run as a child process in the same call, before the benchmark allocates anything on the GPU,
// its JSON lines parsed into the table's dense column and NSA / dense ratio. Host-only (tested on
// the CPU); finding and running the script is dense_baseline.h's.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "nsa/model_config.h"

namespace nsa::app {

// One sequence length's dense step.
struct DenseTrainResult {
  int64_t batch = 0;
  double step_ms = 0, tokens_per_s = 0, peak_bytes = 0;
};

struct DenseTrainBaseline {
  std::map<int64_t, DenseTrainResult> by_len;  // S → result
  std::vector<std::string> records;            // every JSON line the script printed, for --json
  std::string note;                            // why results are missing (empty when all ran)
};

// The "dense_train" lines of the script's output (other JSON lines are kept in records, anything
// that is not JSON is ignored).
DenseTrainBaseline parse_dense_train(const std::string& output);

// Empty when the script builds the same model as cfg but for the attention (tied embeddings, a
// SwiGLU MLP, d_k = d_v, RMSNorm and RoPE, no biases); else what differs, for the note.
std::string dense_train_mismatch(const ModelConfig& cfg);

// The command line that runs `script` with `interpreter` for these lengths, cfg's shape and the
// benchmark's steps (arguments quoted for the shell).
std::string dense_train_command(const std::string& interpreter, const std::string& script,
                                const ModelConfig& cfg, const std::vector<int64_t>& seq_lens,
                                int64_t tokens_per_step, int64_t steps, int64_t warmup);

// Runs the command and parses what it printed; a note (never a throw) when it failed or printed
// no result for some length.
DenseTrainBaseline run_dense_train(const std::string& command,
                                   const std::vector<int64_t>& seq_lens);

}  // namespace nsa::app
