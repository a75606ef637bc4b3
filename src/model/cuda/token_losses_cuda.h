// The GPU model's loss of every token of one forward (`nsa eval --by-position --device cuda`; see
// train/position_loss.h for the CPU twin, token_losses_cpu).
#pragma once

#include <cstdint>
#include <vector>

#include "model/model_params.h"
#include "nsa/config.h"

namespace nsa::cuda {

// [T] for inputs and targets laid out as `layout`; fp32 on the device, widened to double.
std::vector<double> token_losses_cuda(const ModelConfig& cfg, const ModelParams<float>& params,
                                      const SeqLayout& layout, const std::vector<int32_t>& inputs,
                                      const std::vector<int32_t>& targets);

}  // namespace nsa::cuda
