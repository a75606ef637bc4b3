// `nsa eval --task needle`: retrieval accuracy of a checkpoint by context length and needle depth.
//
// For each (length S, depth) it builds `samples` needle sequences (data/needle.h; fixed seeds, the
// same for every checkpoint), runs the model once over all of them and counts a sample as
// retrieved when the argmax of the logits reproduces every value token after the question
// (teacher-forced: position value_at − 1 + j must predict value token j).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace nsa {

struct NeedleCell {
  int64_t seq_len = 0;
  double depth = 0;
  int64_t samples = 0, retrieved = 0;
  int64_t value_tokens_right = 0;  // of samples · 4: partial credit, for watching training
  double accuracy() const { return samples ? static_cast<double>(retrieved) / samples : 0.0; }
};

std::vector<NeedleCell> evaluate_needle(const std::string& checkpoint,
                                        const std::vector<int64_t>& seq_lens,
                                        const std::vector<double>& depths, int64_t samples);

}  // namespace nsa
