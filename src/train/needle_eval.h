// `nsa eval --task needle`: retrieval accuracy of a checkpoint by context length and needle depth.
//
// For each (length S, depth) it builds `samples` needle sequences (data/needle.h, in the cycle or
// the random filler; fixed seeds, the same for every checkpoint), runs the model once over all of
// them and counts a sample as retrieved when the argmax of the logits reproduces every value token
// after the question (teacher-forced: position value_at − 1 + j must predict value token j).
// Samples go through the model in chunks of at most 64k tokens (one sequence when S is longer).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "data/needle.h"
#include "model/model_params.h"
#include "nsa/config.h"

namespace nsa {

struct NeedleCell {
  int64_t seq_len = 0;
  double depth = 0;
  int64_t samples = 0, retrieved = 0;
  int64_t value_tokens_right = 0;  // of samples · 4: partial credit, for watching training
  double accuracy() const { return samples ? static_cast<double>(retrieved) / samples : 0.0; }
};

// The logits [rows.size(), vocab] at token rows `rows` of one forward over `inputs` (targets only
// feed the loss) laid out as `layout` – the CPU model (logit_rows_cpu) or a GPU one.
using LogitRowsFn = std::function<std::vector<float>(
    const ModelConfig&, const ModelParams<float>&, const SeqLayout&,
    const std::vector<int32_t>& inputs, const std::vector<int32_t>& targets,
    const std::vector<int64_t>& rows)>;

std::vector<float> logit_rows_cpu(const ModelConfig& cfg, const ModelParams<float>& params,
                                  const SeqLayout& layout, const std::vector<int32_t>& inputs,
                                  const std::vector<int32_t>& targets,
                                  const std::vector<int64_t>& rows);

std::vector<NeedleCell> evaluate_needle(const std::string& checkpoint,
                                        const std::vector<int64_t>& seq_lens,
                                        const std::vector<double>& depths, int64_t samples,
                                        const LogitRowsFn& logit_rows = logit_rows_cpu,
                                        NeedleFiller filler = NeedleFiller::kCycle);

}  // namespace nsa
