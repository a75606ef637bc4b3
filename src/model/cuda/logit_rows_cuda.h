// The GPU model's logits at chosen token rows of one forward (needle evaluation on the GPU; see
// train/needle_eval.h for the CPU twin, logit_rows_cpu).
#pragma once

#include <cstdint>
#include <vector>

#include "model/model_cpu.h"
#include "model/model_evaluators.h"
#include "model/model_params.h"
#include "nsa/config.h"

namespace nsa::cuda {

// One call: builds the model for `layout`, uploads `params`, runs one forward and frees it all.
std::vector<float> logit_rows_cuda(const ModelConfig& cfg, const ModelParams<float>& params,
                                   const SeqLayout& layout, const std::vector<int32_t>& inputs,
                                   const std::vector<int32_t>& targets,
                                   const std::vector<int64_t>& rows, ProbeRows* probe = nullptr);

// An evaluator for one command (`nsa eval --task needle --device cuda`): it keeps its GPU model
// (forward_model_cuda.h) between calls and builds it again only when the layout changes, so the
// 500 one-sequence calls of a 64k evaluation build it once. A call with another `&params` or a
// config that differs in any field starts over with those; the parameters at one address must not
// change between calls. Copies of the evaluator share the model.
LogitRowsFn make_logit_rows_cuda();

}  // namespace nsa::cuda
