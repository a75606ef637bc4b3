// `nsa eval --task needle`: retrieval accuracy of a checkpoint by context length and needle depth.
//
// For each (length S, depth) it builds `samples` needle sequences (data/needle.h, in the cycle or
// the random filler; fixed seeds, the same for every checkpoint), runs the model once over all of
// them and counts a sample as retrieved when the argmax of the logits reproduces every value token
// after the question (teacher-forced: position value_at − 1 + j must predict value token j).
// Samples go through the model in chunks of at most 64k tokens (one sequence when S is longer).
//
// With `probe` it also asks, at the row that predicts the first value token (the query's last key
// token), whether each layer's selection held the needle: whether the selected blocks of at least
// one group (every group) include a block of the needle's value tokens – the tokens the answer
// copies – and whether those tokens lie in the window there anyway. A miss whose needle no layer
// selected failed at the selection; a miss whose needle was selected failed after it (the
// attention over the selected blocks, the gates, or what the layers above make of it). The CPU
// model also tells, per head, how much of its attention fell on the needle's value tokens there.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "data/needle.h"
#include "model/model_cpu.h"
#include "model/model_evaluators.h"
#include "model/model_params.h"
#include "nsa/config.h"

namespace nsa {

// What the probe's attention mass is measured on: the needle's value tokens (the tokens the
// answer copies), and the selection blocks that hold them, up to the probed row (a layer may have
// copied a value into the tokens after it, within its block).
enum NeedleSpan { kValueTokens = 0, kValueBlocks = 1, kNeedleSpans = 2 };

struct NeedleCell {
  int64_t seq_len = 0;
  double depth = 0;
  int64_t samples = 0, retrieved = 0;
  int64_t value_tokens_right = 0;  // of samples · 4: partial credit, for watching training
  // The probe (empty without it): per layer, the samples whose needle was selected by at least
  // one group / by every group; the samples whose needle lay in the window at the probed row; the
  // misses whose needle no group of any layer selected; per layer, head and branch
  // [layers · heads · 3], the sums over samples (and over the missed ones) of each head's gate at
  // the probed row.
  std::vector<int64_t> selected_any, selected_all;
  int64_t in_window = 0, missed_unselected = 0;
  std::vector<double> gate_sum, gate_sum_missed;
  // Did the head look at the needle? Answered by the CPU model only (empty from a GPU one): per
  // span (NeedleSpan), layer, head and branch [2 · layers · heads · 3], the sums over the samples
  // of the branch's softmax mass on the span at the probed row (the compressed branch: on the
  // compressed tokens covering it; attention_mass.h); per span, layer and head
  // [2 · layers · heads], the sums over the samples (the missed ones) of the weight the span gets
  // in the head's output, Σ_c gate_c · mass_c.
  std::vector<double> mass_sum, weight_sum, weight_sum_missed;
  double accuracy() const { return samples ? static_cast<double>(retrieved) / samples : 0.0; }
  // Heads per layer, by the probe's gate sums (0 without the probe).
  int64_t heads() const {
    return selected_any.empty()
               ? 0
               : static_cast<int64_t>(gate_sum.size() / (selected_any.size() * kNumBranches));
  }
  // The mean over the samples of head `head`'s mass on span `span` in branch `branch`.
  double head_mass(size_t layer, int64_t head, int branch, int span = 0) const;
  // The mean over the samples (the missed ones) of span `span`'s weight in head `head`'s output;
  // 0 where there are none.
  double needle_weight(size_t layer, int64_t head, bool missed = false, int span = 0) const;
  // Head `head`'s gate of `branch` at layer `layer`, the mean over the samples (the missed ones);
  // 0 where there are none.
  double head_gate(size_t layer, int64_t head, int branch, bool missed = false) const;
  // The same, the mean over the heads too.
  double gate(size_t layer, int branch, bool missed = false) const;
  // The index of (span, layer, head) in weight_sum (× 3 + branch: in mass_sum).
  size_t span_layer_head(int span, size_t layer, int64_t head) const;
};

// The CPU model's LogitRowsFn (model/model_evaluators.h); the GPU one is model/cuda's.

std::vector<float> logit_rows_cpu(const ModelConfig& cfg, const ModelParams<float>& params,
                                  const SeqLayout& layout, const std::vector<int32_t>& inputs,
                                  const std::vector<int32_t>& targets,
                                  const std::vector<int64_t>& rows, ProbeRows* probe = nullptr);

// What `nsa eval --task needle` measures: a cell per (length, depth), `samples` sequences each, in
// `filler`; with `probe`, the selection's view of the needle (above). n_sel > 0: the model attends
// with n_sel selected blocks instead of its config's (`--n-sel`; no weight depends on it) – whether
// a needle missed at n_sel is one the selection would hold with more blocks.
struct NeedleEvalOptions {
  std::vector<int64_t> seq_lens;
  std::vector<double> depths;
  int64_t samples = 20;
  NeedleFiller filler = NeedleFiller::kCycle;
  bool probe = false;
  int64_t n_sel = 0;
};

// The cells in order: lengths outer, depths inner.
std::vector<NeedleCell> evaluate_needle(const std::string& checkpoint, const NeedleEvalOptions& opt,
                                        const LogitRowsFn& logit_rows = logit_rows_cpu);

}  // namespace nsa
