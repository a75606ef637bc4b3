// state.json of a checkpoint is input like any config file: a damaged or hostile one (a negative
// step, a huge config value, a field of the wrong type, an unknown key) is an nsa::Error naming
// the file and the field – never a negative loop bound, a huge allocation or a crash.
#pragma once

#include <cstdint>
#include <string>

#include "checkpoint.h"
#include "token_loader.h"

namespace nsa {

// The largest step a checkpoint may claim (far beyond any run; it keeps step arithmetic exact).
constexpr int64_t kMaxCheckpointStep = int64_t{1} << 40;

// Parses and validates the text of `path` (a checkpoint's state.json): types and ranges of
// step and train_position, the model config through the config parser and its validation, and
// the step against the checkpoint folder's name.
TrainState parse_train_state(const std::string& path, const std::string& text);

// The resumed data position must lie inside the data the run reads.
void check_resume_position(const TrainState& state, const TokenLoader& loader,
                           const std::string& checkpoint);

}  // namespace nsa
