// Needle retrieval accuracy (see needle_eval.h), on the CPU model.
#include "needle_eval.h"

#include "data/needle.h"
#include "model/model_cpu.h"
#include "nsa/error.h"
#include "trainer.h"

namespace nsa {

std::vector<NeedleCell> evaluate_needle(const std::string& checkpoint,
                                        const std::vector<int64_t>& seq_lens,
                                        const std::vector<double>& depths, int64_t samples) {
  NSA_CHECK(samples > 0, "--samples must be positive");
  const LoadedModel m = load_model_checkpoint(checkpoint);
  const int64_t V = m.cfg.vocab_size;
  std::vector<NeedleCell> cells;
  for (const int64_t S : seq_lens) {
    for (const double depth : depths) {
      NSA_CHECK(depth >= 0 && depth <= 1, "--depths: ", depth, " is outside [0, 1]");
      const int64_t T = S - 1;  // inputs: tokens [0, S − 1), targets: [1, S)
      std::vector<int32_t> inputs, targets;
      std::vector<NeedleSequence> seqs;
      for (int64_t i = 0; i < samples; ++i) {
        seqs.push_back(make_needle_sequence(S, depth, V, 0x5eed0000ull + static_cast<uint64_t>(i)));
        const std::vector<int32_t>& t = seqs.back().tokens;
        inputs.insert(inputs.end(), t.begin(), t.end() - 1);
        targets.insert(targets.end(), t.begin() + 1, t.end());
      }
      ModelStats stats;
      stats.keep_outputs = true;
      model_loss_cpu<float>(m.cfg, m.params, SeqLayout::batch(samples, T), inputs, targets, nullptr,
                            &stats);
      NeedleCell cell{S, depth, samples, 0, 0};
      for (int64_t i = 0; i < samples; ++i) {
        bool all = true;
        for (int64_t j = 0; j < kNeedleValueLen; ++j) {
          const int64_t pos = seqs[i].value_at - 1 + j;  // predicts token value_at + j
          const float* row = stats.logits.ptr() + (i * T + pos) * V;
          int64_t best = 0;
          for (int64_t v = 1; v < V; ++v) best = row[v] > row[best] ? v : best;
          const bool right = best == seqs[i].tokens[seqs[i].value_at + j];
          cell.value_tokens_right += right ? 1 : 0;
          all = all && right;
        }
        cell.retrieved += all ? 1 : 0;
      }
      cells.push_back(cell);
    }
  }
  return cells;
}

}  // namespace nsa
