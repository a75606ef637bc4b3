// Training / validation batches (see token_loader.h).
#include "token_loader.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "data/needle.h"
#include "io/token_shard.h"
#include "nsa/error.h"

namespace nsa {
namespace fs = std::filesystem;

namespace {

bool starts_with(const std::string& s, const std::string& prefix) {
  return s.rfind(prefix, 0) == 0;
}

// "needle", "needle:N", "needle-random", "needle-random:N", "needle-short", "needle-random-short"
// or "copy" (one row kind).
RecallRow parse_recall_row(const std::string& item, const std::string& source) {
  RecallRow row;
  if (item == "copy") {
    row.copy = true;
    return row;
  }
  const bool random = starts_with(item, "needle-random");
  const std::string name = random ? "needle-random" : "needle";
  NSA_CHECK(starts_with(item, name), "--data '", source, "': unknown row kind '", item,
            "' (copy, needle[:N], needle-random[:N], needle-short, needle-random-short)");
  row.filler = random ? NeedleFiller::kRandom : NeedleFiller::kCycle;
  const std::string rest = item.substr(name.size());
  if (rest.empty()) return row;
  if (rest == "-short") {
    row.short_task = true;
    return row;
  }
  const std::string n = rest.substr(1);
  const bool digits = rest[0] == ':' && !n.empty() && n.size() <= 3 &&
                      n.find_first_not_of("0123456789") == std::string::npos;
  row.needles = digits ? std::stoll(n) : 0;
  NSA_CHECK(digits && row.needles >= 1 && row.needles <= kMaxNeedles, "--data '", source,
            "': needle:N, needle-random:N and needle-mix:N take N needles per sequence, 1 to ",
            kMaxNeedles);
  return row;
}

}  // namespace

bool is_recall_source(const std::string& source) {
  return source == "copy" || starts_with(source, "needle") || source.find('+') != std::string::npos;
}

std::vector<RecallRow> parse_recall_rows(const std::string& source) {
  std::vector<RecallRow> rows;
  if (starts_with(source, "needle-mix")) {  // the older spelling of needle:N+copy
    NSA_CHECK(starts_with(source, "needle-mix:"), "--data '", source,
              "': needle-mix takes a count, needle-mix:N");
    rows.push_back(parse_recall_row("needle" + source.substr(10), source));
    rows.push_back(parse_recall_row("copy", source));
    return rows;
  }
  size_t begin = 0;
  while (true) {
    const size_t end = source.find('+', begin);
    rows.push_back(parse_recall_row(source.substr(begin, end - begin), source));
    if (end == std::string::npos) break;
    begin = end + 1;
  }
  return rows;
}

namespace {

// The split's shards in a folder: the ones its meta.json lists where nsa prepare made it (by file
// name, in this folder, so that the folder can move), so that a stray <split>_*.bin – another
// preparation's, a copy – is never mixed in; else every <split>_*.bin in name order (llm.c's
// folders have no meta.json).
std::vector<fs::path> split_shards(const std::string& source, const std::string& split) {
  const fs::path meta = fs::path(source) / "meta.json";
  std::vector<fs::path> shards;
  if (fs::exists(meta)) {
    std::ifstream f(meta);
    const nlohmann::json j = nlohmann::json::parse(f, nullptr, false);
    const std::string key = split + "_shards";
    NSA_CHECK(!j.is_discarded() && j.is_object() && j.contains(key) && j[key].is_array(), "'",
              meta.string(), "' has no '", key,
              "' list (is it nsa prepare's?): prepare the folder again, or remove the file to read "
              "every ",
              split, "_*.bin");
    for (const auto& e : j[key]) {
      NSA_CHECK(e.is_string(), "'", meta.string(), "': an entry of '", key, "' is not a path");
      const fs::path p = fs::path(source) / fs::path(e.get<std::string>()).filename();
      NSA_CHECK(fs::is_regular_file(p), "shard '", p.string(), "', listed in '", meta.string(),
                "', is missing: prepare the folder again");
      shards.push_back(p);
    }
    return shards;
  }
  for (const auto& e : fs::directory_iterator(source)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(split + "_", 0) == 0 && e.path().extension() == ".bin")
      shards.push_back(e.path());
  }
  std::sort(shards.begin(), shards.end());
  return shards;
}

}  // namespace

TokenLoader::TokenLoader(const std::string& source, const std::string& split, int64_t vocab_size,
                         uint64_t seed)
    : seed_(seed), vocab_(vocab_size) {
  if (!fs::is_directory(source) && is_recall_source(source)) {
    rows_ = parse_recall_rows(source);
    NSA_CHECK(vocab_size >= kNeedleMinVocab, "--data '", source,
              "' needs vocab_size >= ", kNeedleMinVocab, ", got ", vocab_size);
    synthetic_ = needle_ = true;
    seed_ = seed + (split == "val" ? 0x9e3779b97f4a7c15ull : 0);
    return;
  }
  if (source == "synthetic" || source == "repeat") {
    synthetic_ = true;
    repeat_ = source == "repeat";
    seed_ = seed + (split == "val" ? 0x9e3779b97f4a7c15ull : 0);
    return;
  }
  NSA_CHECK(fs::is_directory(source), "--data '", source,
            "' is neither a folder of token shards nor 'synthetic' (make shards with nsa prepare)");
  const std::vector<fs::path> shards = split_shards(source, split);
  NSA_CHECK(!shards.empty(), "--data '", source, "' has no ", split, "_*.bin shards");
  for (const auto& s : shards) {
    const std::vector<uint32_t> part = io::read_token_shard(s.string());
    for (size_t i = 0; i < part.size(); ++i) {
      NSA_CHECK(part[i] < static_cast<uint32_t>(vocab_), "token ", part[i], " at index ", i,
                " of shard '", s.string(), "' is outside the model's vocabulary of ", vocab_,
                " (vocab_size must cover the tokenizer's)");
    }
    tokens_.insert(tokens_.end(), part.begin(), part.end());
  }
}

int64_t TokenLoader::distinct_batches(int64_t batch, int64_t seq_len) const {
  if (synthetic_ || needle_) return std::numeric_limits<int64_t>::max();
  const int64_t n = batch * seq_len;  // a batch reads n + 1 tokens and steps by n
  return n > 0 ? std::max<int64_t>(0, num_tokens() - 1) / n : 0;
}

Batch TokenLoader::next(int64_t batch, int64_t seq_len) {
  const int64_t n = batch * seq_len;
  Batch b;
  b.inputs.resize(static_cast<size_t>(n));
  b.targets.resize(static_cast<size_t>(n));
  if (needle_) {  // one recall row of S + 1 tokens per row, a pure function of (seed, row)
    for (int64_t r = 0; r < batch; ++r) {
      // The kind follows the row's index in the whole stream, not in the batch: with B = 2 and
      // three kinds a per-batch turn would never draw the third.
      const int64_t row = position_ * batch + r;
      const uint64_t row_seed = seed_ + static_cast<uint64_t>(row) * 7919u;
      const RecallRow& kind = rows_[static_cast<size_t>(row) % rows_.size()];
      const std::vector<int32_t> t =
          kind.copy ? make_periodic_sequence(seq_len + 1, vocab_, row_seed)
          : kind.short_task
              ? make_short_needle_sequence(seq_len + 1, vocab_, row_seed, kind.filler).tokens
              : make_multi_needle_sequence(seq_len + 1, kind.needles, vocab_, row_seed, kind.filler)
                    .tokens;
      std::copy(t.begin(), t.end() - 1, b.inputs.begin() + r * seq_len);
      std::copy(t.begin() + 1, t.end(), b.targets.begin() + r * seq_len);
    }
    ++position_;
    return b;
  }
  if (synthetic_) {
    // splitmix64 of (seed, batch index, element): reproducible without stored state.
    for (int64_t i = 0; i <= n; ++i) {
      uint64_t z =
          seed_ + 0x9e3779b97f4a7c15ull * (static_cast<uint64_t>(position_) * (n + 1) + i + 1);
      z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
      z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
      z ^= z >> 31;
      const auto tok = static_cast<int32_t>(z % static_cast<uint64_t>(vocab_));
      if (i < n) b.inputs[i] = tok;
      if (i > 0) b.targets[i - 1] = tok;
    }
    if (repeat_) {  // every row's second half repeats its first: copying needs attention
      const int64_t half = (seq_len + 2) / 2;  // row tokens 0..S (S + 1 with the last target)
      for (int64_t r = 0; r < batch; ++r) {
        for (int64_t t = half; t <= seq_len; ++t) {
          const int32_t tok = t - half < seq_len ? b.inputs[r * seq_len + t - half]
                                                 : b.targets[r * seq_len + t - half - 1];
          if (t < seq_len) b.inputs[r * seq_len + t] = tok;
          b.targets[r * seq_len + t - 1] = tok;
        }
      }
    }
    ++position_;
    return b;
  }
  const int64_t total = num_tokens();
  NSA_CHECK(total > n, "the split has ", total, " tokens, fewer than one batch of ", n + 1,
            " (lower --batch or seq_len)");
  if (position_ + n + 1 > total) position_ = 0;  // wrap: next epoch
  for (int64_t i = 0; i < n; ++i) {
    b.inputs[i] = static_cast<int32_t>(tokens_[position_ + i]);
    b.targets[i] = static_cast<int32_t>(tokens_[position_ + i + 1]);
  }
  position_ += n;
  return b;
}

}  // namespace nsa
