// Training checkpoints: written atomically, resumed exactly.
//
// A checkpoint is a folder `ckpt_NNNNNNNN/` (the number of completed steps) holding
// model.safetensors (weights, Llama-style names, loadable by PyTorch/HF tools),
// optimizer.safetensors (AdamW moments `m.<name>`, `v.<name>`), state.json (step, data position,
// the model config) and, written last, the marker COMPLETE. It is assembled as `ckpt_NNNNNNNN.tmp/`
// and renamed into place, so a crash never leaves a half-written checkpoint that looks complete.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "nsa/tensor.h"

namespace nsa {

struct TrainState {
  int64_t step = 0;            // completed optimizer steps
  int64_t train_position = 0;  // data loader position
  std::map<std::string, std::string> model_config;
};

using NamedTensors = std::vector<std::pair<std::string, Tensor<float>*>>;

// Writes out_dir/ckpt_<step>/ atomically and removes all but the newest `keep` checkpoints.
std::string save_checkpoint(const std::string& out_dir, const TrainState& state,
                            const NamedTensors& params, std::vector<Tensor<float>>& adam_m,
                            std::vector<Tensor<float>>& adam_v, int keep);
// The newest complete checkpoint in out_dir, or "" when there is none.
std::string latest_checkpoint(const std::string& out_dir);
// state.json of a complete checkpoint.
TrainState read_checkpoint_state(const std::string& dir);
// Only the weights (for evaluation and generation), into existing tensors.
void load_model_weights(const std::string& dir, const NamedTensors& params);
// --checkpoint DIR, or the newest complete checkpoint of --run DIR; errors say which is missing.
std::string resolve_checkpoint(const std::string& checkpoint, const std::string& run);
// Loads into existing tensors (names and shapes must match; errors name the file and tensor).
TrainState load_checkpoint(const std::string& dir, const NamedTensors& params,
                           std::vector<Tensor<float>>& adam_m, std::vector<Tensor<float>>& adam_v);

}  // namespace nsa
