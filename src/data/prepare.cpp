// The `nsa prepare` pipeline (see prepare.h).
#include "prepare.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <utility>
#include <vector>

#include "corpus_fetch.h"
#include "io/paths.h"
#include "io/token_shard.h"
#include "nsa/error.h"
#include "text_corpus.h"
#include "tokenizer.h"

namespace nsa::data {
namespace fs = std::filesystem;
namespace {

std::vector<std::string> write_shards(const std::vector<uint32_t>& tokens, int64_t shard_tokens,
                                      const fs::path& dir, const std::string& split) {
  std::vector<std::string> paths;
  const int64_t n = static_cast<int64_t>(tokens.size());
  for (int64_t start = 0, k = 0; start < n || k == 0; start += shard_tokens, ++k) {
    char name[64];
    std::snprintf(name, sizeof name, "%s_%06lld.bin", split.c_str(), static_cast<long long>(k));
    const int64_t end = std::min(n, start + shard_tokens);
    const std::vector<uint32_t> part(tokens.begin() + start, tokens.begin() + end);
    paths.push_back((dir / name).string());
    io::write_token_shard(paths.back(), part);
    if (end >= n) break;
  }
  return paths;
}

// A shard name as write_shards makes it: <split>_<six digits>.bin.
bool is_shard_name(const std::string& name) {
  for (const std::string split : {"train_", "val_"}) {
    if (name.size() == split.size() + 10 && name.rfind(split, 0) == 0 &&
        name.compare(name.size() - 4, 4, ".bin") == 0 &&
        std::all_of(name.begin() + static_cast<std::ptrdiff_t>(split.size()), name.end() - 4,
                    [](char c) { return c >= '0' && c <= '9'; }))
      return true;
  }
  return false;
}

// What an earlier preparation into the same folder left that this one did not rewrite: its
// extra shards (our loader reads only the shards meta.json lists, but a tool that reads every
// train_*.bin, as llm.c's do, would mix them in) and a tokenizer.model the new shards do not use.
// Removed after the new meta.json is in place.
std::vector<std::string> remove_stale_outputs(const fs::path& dir, const PrepareResult& r,
                                              const std::string& sp_model) {
  std::vector<std::string> keep;  // this preparation's shards, by name
  for (const auto* list : {&r.train_shards, &r.val_shards}) {
    for (const std::string& p : *list) keep.push_back(fs::path(p).filename().string());
  }
  std::vector<fs::path> stale;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (e.is_regular_file() && is_shard_name(name) &&
        std::find(keep.begin(), keep.end(), name) == keep.end())
      stale.push_back(e.path());
  }
  const fs::path model = dir / "tokenizer.model";
  std::error_code ec;
  const bool model_used =
      r.tokenizer == "sentencepiece" && (sp_model.empty() || fs::equivalent(model, sp_model, ec));
  if (!model_used && fs::is_regular_file(model)) stale.push_back(model);
  std::vector<std::string> removed;
  for (const fs::path& p : stale) {
    fs::remove(p);
    removed.push_back(p.filename().string());
  }
  std::sort(removed.begin(), removed.end());
  return removed;
}

// Each input once: the same path twice, or a path inside a folder that is also an input, would put
// its documents into the corpus twice (the probe of the thirty-second session found them counted
// twice). Compared as io::normal_path spells them (a missing one is load_documents' to name).
void check_distinct_inputs(const std::vector<std::string>& inputs) {
  std::vector<std::pair<fs::path, std::string>> seen;  // (normalised, as given)
  for (const std::string& in : inputs) {
    const fs::path p = io::normal_path(in);
    for (const auto& [q, given] : seen) {
      NSA_CHECK(p != q, "--input '", in, "' is given twice (as '", given,
                "'); pass each file or folder once");
      NSA_CHECK(!io::lies_within(p, q) && !io::lies_within(q, p), "--input '", in, "' and '", given,
                "' overlap (one lies in the other): their documents would be counted twice; pass "
                "each once");
    }
    seen.emplace_back(p, in);
  }
}

}  // namespace

PrepareResult prepare_corpus(const PrepareOptions& o) {
  NSA_CHECK(o.val_fraction >= 0.0 && o.val_fraction <= 0.5, "--val-fraction ", o.val_fraction,
            " must be within [0, 0.5]");
  NSA_CHECK(o.shard_tokens > 0, "--shard-tokens must be positive");
  NSA_CHECK(o.tokenizer == "bytes" || o.tokenizer == "sentencepiece", "--tokenizer '", o.tokenizer,
            "' is not one of: bytes, sentencepiece");
  std::vector<std::string> inputs = o.inputs;
  if (o.fetch) {
    for (const std::string& dir : fetch_default_corpus(o.cache_dir)) inputs.push_back(dir);
  }
  NSA_CHECK(!inputs.empty(),
            "nothing to prepare: pass --input PATH (files, directories, .jsonl) and/or --fetch");
  check_distinct_inputs(inputs);
  const std::vector<Document> docs = load_documents(inputs);
  NSA_CHECK(!docs.empty(), "the inputs hold no documents");
  NSA_CHECK(
      std::any_of(docs.begin(), docs.end(), [](const Document& d) { return !d.text.empty(); }),
      "the inputs hold no text (", docs.size(), " empty document(s)); nothing was written");
  // A folder this call creates goes again if the preparation fails (a vocabulary the text cannot
  // fill, a full disk): everything in it is this call's.
  struct RemoveIfFailed {
    fs::path dir;
    bool armed;
    ~RemoveIfFailed() {
      std::error_code ignored;
      if (armed) fs::remove_all(dir, ignored);
    }
  } created{o.out_dir, io::make_out_folder(o.out_dir, "--out", "a folder for the shards")};

  std::unique_ptr<Tokenizer> tok;
  if (o.tokenizer == "bytes") {
    tok = make_byte_tokenizer();
  } else if (!o.sp_model.empty()) {
    tok = load_sentencepiece(o.sp_model);
  } else {
    tok =
        train_sentencepiece(docs, o.vocab_size, (fs::path(o.out_dir) / "tokenizer.model").string());
  }

  std::vector<std::vector<uint32_t>> encoded(docs.size());
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t i = 0; i < static_cast<int64_t>(docs.size()); ++i) {
    encoded[i] = tok->encode(docs[i].text);
  }
  std::vector<uint32_t> train, val;
  PrepareResult r;
  for (const auto& ids : encoded) {
    if (ids.empty()) continue;
    ++r.documents;
    const auto n = static_cast<int64_t>(ids.size());
    const auto n_val = static_cast<int64_t>(std::ceil(o.val_fraction * static_cast<double>(n)));
    train.insert(train.end(), ids.begin(), ids.end() - n_val);
    train.push_back(tok->eot());
    if (n_val > 0) {
      val.insert(val.end(), ids.end() - n_val, ids.end());
      val.push_back(tok->eot());
    }
  }
  NSA_CHECK(r.documents > 0, "the inputs' text encodes to no tokens with the ", tok->name(),
            " tokenizer");
  r.train_tokens = static_cast<int64_t>(train.size());
  r.val_tokens = static_cast<int64_t>(val.size());
  r.tokenizer = tok->name();
  r.vocab_size = tok->vocab_size();
  r.eot = tok->eot();
  r.train_shards = write_shards(train, o.shard_tokens, o.out_dir, "train");
  r.val_shards = write_shards(val, o.shard_tokens, o.out_dir, "val");

  nlohmann::json meta = {{"tokenizer", r.tokenizer},
                         {"vocab_size", r.vocab_size},
                         {"eot", r.eot},
                         {"documents", r.documents},
                         {"train_tokens", r.train_tokens},
                         {"val_tokens", r.val_tokens},
                         {"val_fraction", o.val_fraction},
                         {"train_shards", r.train_shards},
                         {"val_shards", r.val_shards},
                         {"inputs", inputs}};
  if (r.tokenizer == "sentencepiece") {
    meta["tokenizer_model"] =
        o.sp_model.empty() ? (fs::path(o.out_dir) / "tokenizer.model").string() : o.sp_model;
  }
  const fs::path meta_path = fs::path(o.out_dir) / "meta.json";
  std::ofstream(meta_path.string() + ".tmp") << meta.dump(2) << "\n";
  fs::rename(meta_path.string() + ".tmp", meta_path);
  created.armed = false;  // the preparation is complete
  r.removed = remove_stale_outputs(o.out_dir, r, o.sp_model);
  return r;
}

}  // namespace nsa::data
