// Batches of (input, target) tokens for training and validation.
//
// From shards (llm.c format, `train_*.bin` / `val_*.bin` in a folder): the split's shards are
// read (validated) and concatenated; each batch is the next B·S + 1 contiguous tokens (inputs
// [0, B·S), targets shifted by one), wrapping to the start at the end of the split. The position
// is the whole state, so a checkpoint resumes the exact stream. Synthetic data ("synthetic"):
// uniform random tokens from a counter-based generator of (seed, batch index) – nothing to store;
// "repeat": the same, with each row's second half a copy of its first (learnable only through
// attention that finds the earlier occurrence: the classic induction task).
// The needle task ("needle", data/needle.h): one needle sequence per row at a random depth, also a
// pure function of (seed, batch index, row); "needle:N" puts N needles and N questions in each row;
// "needle-random[:N]" the same in a random-symbol filler; "copy": periodic copy rows (content-based
// recall at random distances: an induction head is the only way to predict them, unlike "repeat",
// whose fixed distance a positional head solves). Row kinds joined by '+' take turns: row i of
// the stream (batch b, row r: i = b·B + r) is of kind i mod k ("copy+needle-random:8");
// "needle-mix:N" = "needle:N+copy". Every token is checked against the vocabulary when the split
// is opened.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "data/needle.h"

namespace nsa {

// One kind of synthetic recall row: a periodic copy row, or needles in a filler.
struct RecallRow {
  bool copy = false;
  bool short_task = false;  // "needle-short": make_short_needle_sequence
  int64_t needles = 1;
  NeedleFiller filler = NeedleFiller::kCycle;
};
// Whether `source` names recall rows (copy, needle…, or kinds joined by '+'), and their kinds; a
// malformed list is an error naming the source and the kinds allowed.
bool is_recall_source(const std::string& source);
std::vector<RecallRow> parse_recall_rows(const std::string& source);

struct Batch {
  std::vector<int32_t> inputs, targets;  // [B·S]
};

class TokenLoader {
 public:
  // source: a folder of shards, "synthetic", "repeat", or recall rows ("copy", "needle[:N]",
  // "needle-random[:N]", "needle-short", "needle-random-short", "needle-mix:N", kinds joined by
  // '+');
  // split: "train" or "val".
  TokenLoader(const std::string& source, const std::string& split, int64_t vocab_size,
              uint64_t seed);
  Batch next(int64_t batch, int64_t seq_len);
  int64_t position() const { return position_; }
  void set_position(int64_t p) { position_ = p; }
  int64_t num_tokens() const { return static_cast<int64_t>(tokens_.size()); }
  // Batches of batch × seq_len tokens that next() returns before it wraps to the split's start
  // (shards); the generated sources never repeat (INT64_MAX).
  int64_t distinct_batches(int64_t batch, int64_t seq_len) const;
  bool synthetic() const { return synthetic_; }
  bool needle() const { return needle_; }

 private:
  bool synthetic_ = false, needle_ = false, repeat_ = false;
  uint64_t seed_ = 0;
  int64_t vocab_ = 0;
  std::vector<RecallRow> rows_;  // recall rows: the kinds rows take in turn
  std::vector<uint32_t> tokens_;
  int64_t position_ = 0;  // next token (shards) or next batch index (synthetic)
};

}  // namespace nsa
