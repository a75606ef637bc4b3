// The GPU model's loss of every token of one forward (`nsa eval --by-position --device cuda`; see
// train/position_loss.h for the CPU twin, token_losses_cpu).
#pragma once

#include <cstdint>
#include <vector>

#include "model/model_evaluators.h"
#include "model/model_params.h"
#include "nsa/config.h"

namespace nsa::cuda {

// [T] for inputs and targets laid out as `layout`; fp32 on the device, widened to double. One
// call: builds the model for `layout`, uploads `params`, runs one forward and frees it all.
std::vector<double> token_losses_cuda(const ModelConfig& cfg, const ModelParams<float>& params,
                                      const SeqLayout& layout, const std::vector<int32_t>& inputs,
                                      const std::vector<int32_t>& targets);

// An evaluator for one command (`nsa eval --by-position --device cuda`): it keeps its GPU model
// (forward_model_cuda.h) between calls and builds it again only when the layout changes. A call
// with another `&params` or a config that differs in any field starts over with those; the
// parameters at one address must not change between calls. Copies of the evaluator share the
// model.
TokenLossesFn make_token_losses_cuda();

}  // namespace nsa::cuda
