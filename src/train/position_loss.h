// `nsa eval --by-position`: a checkpoint's mean validation loss per token-position bucket. A model
// that uses context beyond its window shows it as loss that keeps falling with position past w
// (docs/quality.md). Position p of a sequence is the prediction of token p + 1 from tokens 0..p;
// bucket [a, b) averages positions a..b−1 over every sequence of every batch. The batches are
// those of `nsa eval` (the validation split, B·S + 1 contiguous tokens each), so the mean over all
// positions is `nsa eval`'s loss. The JSON file (format in docs/quality.md) and the SVG plot
// (svg_plot.h, one curve per run: `nsa plot --compare`) come from here.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/model_evaluators.h"
#include "model/model_params.h"
#include "nsa/config.h"

namespace nsa {

// The CPU model's TokenLossesFn (model/model_evaluators.h); the GPU one is model/cuda's.

std::vector<double> token_losses_cpu(const ModelConfig& cfg, const ModelParams<float>& params,
                                     const SeqLayout& layout, const std::vector<int32_t>& inputs,
                                     const std::vector<int32_t>& targets);

// The bucket edges for sequences of S tokens, 0 = e_0 < e_1 < ... < e_n = S; bucket i is
// [e_i, e_{i+1}), so the buckets cover every position once. `edges` empty: 0, 512, 1024, 2048,
// ... (doubling while below S), then S. Otherwise the given edges, strictly increasing within
// [0, S], with 0 and S added when missing. Errors name `flag`.
std::vector<int64_t> position_bucket_edges(int64_t S, const std::vector<int64_t>& edges,
                                           const std::string& flag);

struct PositionBucket {
  int64_t begin = 0, end = 0;  // positions [begin, end)
  int64_t tokens = 0;          // losses averaged: (end − begin) · batches · batch
  double loss = 0;             // their mean (nats)
};

struct PositionLoss {
  std::string checkpoint, data, device, attention;
  int64_t step = 0, seq_len = 0, w = 0, batches = 0, batch = 0, tokens = 0;
  double loss = 0;  // over every position: nsa eval's loss of the same batches
  std::vector<PositionBucket> buckets;
};

// Loads the checkpoint (its own config and weights) and averages token_losses over `batches`
// validation batches of `batch` × seq_len (0: the config's seq_len) tokens, by bucket.
// `edges` and the errors naming `--buckets` as in position_bucket_edges.
PositionLoss evaluate_loss_by_position(const std::string& checkpoint, const std::string& data,
                                       int64_t batches, int64_t batch, int64_t seq_len,
                                       const std::vector<int64_t>& edges,
                                       const TokenLossesFn& token_losses,
                                       const std::string& device);

// The JSON file (docs/quality.md); written atomically. read_ validates it: errors name the file
// and the field.
void write_position_loss_json(const PositionLoss& r, const std::string& path);
PositionLoss read_position_loss_json(const std::string& path);

// One curve per run (labels[i] for runs[i]): each bucket's mean loss at its centre on a log2
// position axis, with the windows of the runs that have one (nsa, window) marked.
void write_position_loss_plot(const std::vector<std::string>& labels,
                              const std::vector<PositionLoss>& runs, const std::string& svg_path);

}  // namespace nsa
