// The function types of a model's forward-only evaluations – the logits at chosen rows (`nsa eval
// --task needle`) and each token's loss (`nsa eval --by-position`) – and of their factories, one
// evaluator per command. The CPU model implements them in train/ (logit_rows_cpu,
// token_losses_cpu), the GPU model in model/cuda/; both layers include this one header.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "model/model_cpu.h"
#include "model/model_params.h"
#include "nsa/config.h"

namespace nsa {

// The logits [rows.size(), vocab] at token rows `rows` of one forward over `inputs` (targets only
// feed the loss) laid out as `layout`. With probe, also each layer's selection and gates at those
// rows (model_cpu.h's ProbeRows: the selected blocks of each group, −1 where fewer, as the model's
// sel_idx; each head's gate per branch).
using LogitRowsFn = std::function<std::vector<float>(
    const ModelConfig&, const ModelParams<float>&, const SeqLayout&,
    const std::vector<int32_t>& inputs, const std::vector<int32_t>& targets,
    const std::vector<int64_t>& rows, ProbeRows* probe)>;

// Each token's loss [T] of one forward over `inputs` and `targets` laid out as `layout`.
using TokenLossesFn = std::function<std::vector<double>(
    const ModelConfig&, const ModelParams<float>&, const SeqLayout&,
    const std::vector<int32_t>& inputs, const std::vector<int32_t>& targets)>;

// A fresh evaluator for one command (a backend's, apps/backends.h). A GPU one keeps its model
// between calls and builds it again only when the layout changes, so the 500 one-sequence calls
// of a 64k needle evaluation build it once.
using LogitRowsFactory = std::function<LogitRowsFn()>;
using TokenLossesFactory = std::function<TokenLossesFn()>;

}  // namespace nsa
