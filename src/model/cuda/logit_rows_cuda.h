// The GPU model's logits at chosen token rows of one forward (needle evaluation on the GPU; see
// train/needle_eval.h for the CPU twin, logit_rows_cpu).
#pragma once

#include <cstdint>
#include <vector>

#include "model/model_cpu.h"
#include "model/model_params.h"
#include "nsa/config.h"

namespace nsa::cuda {

std::vector<float> logit_rows_cuda(const ModelConfig& cfg, const ModelParams<float>& params,
                                   const SeqLayout& layout, const std::vector<int32_t>& inputs,
                                   const std::vector<int32_t>& targets,
                                   const std::vector<int64_t>& rows, ProbeRows* probe = nullptr);

}  // namespace nsa::cuda
