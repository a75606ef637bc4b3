// `nsa generate`: text from a checkpoint – prompt through the tokenizer, prefill, then one token
// at a time with NSA caches, streamed to stdout, with tokens/s – on the CPU
// (src/decode/model_decoder.h) or one GPU (src/decode/cuda/model_decoder_cuda.h).
#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>

#include "backends.h"
#include "commands.h"
#include "data/tokenizer.h"
#include "decode/sampler.h"
#include "nsa/error.h"
#include "train/checkpoint.h"
#include "train/trainer.h"

namespace nsa::app {

void register_generate_command(CLI::App& app) {
  struct Args {
    std::string checkpoint, run, prompt = "The", sp_model, device = "cpu";
    int64_t max_new = 200, samples = 1;
    SamplerConfig sampler;
  };
  auto a = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand("generate", "Generate text from a checkpoint");
  cmd->add_option("--checkpoint", a->checkpoint, "a ckpt_* folder");
  cmd->add_option("--run", a->run, "a run folder: its newest complete checkpoint");
  cmd->add_option("--prompt", a->prompt, "prompt text");
  cmd->add_option("--sp-model", a->sp_model, "SentencePiece model (default: bytes, vocab 256)");
  cmd->add_option("--max-new", a->max_new, "tokens to generate");
  cmd->add_option("--temperature", a->sampler.temperature, "0 = greedy");
  cmd->add_option("--top-k", a->sampler.top_k, "sample among the k most likely (0: all)");
  cmd->add_option("--top-p", a->sampler.top_p, "nucleus sampling mass (1: off)");
  cmd->add_option("--seed", a->sampler.seed, "sampling seed (sample i uses seed + i)");
  cmd->add_option("--samples", a->samples,
                  "independent continuations decoded together as one batch (1: streamed)")
      ->check(CLI::Range(int64_t{1}, int64_t{4096}));
  cmd->add_option("--device", a->device, "cpu (the reference) or cuda (one GPU)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  cmd->callback([a] {
    const std::string ckpt = resolve_checkpoint(a->checkpoint, a->run);
    const LoadedModel m = load_model_checkpoint(ckpt);
    const ModelConfig& cfg = m.cfg;
    auto tok =
        a->sp_model.empty() ? data::make_byte_tokenizer() : data::load_sentencepiece(a->sp_model);
    NSA_CHECK(tok->vocab_size() <= cfg.vocab_size, "the tokenizer's vocabulary (",
              tok->vocab_size(), ") exceeds the model's (", cfg.vocab_size, ")");
    std::vector<uint32_t> prompt = tok->encode(a->prompt);
    NSA_CHECK(!prompt.empty(), "--prompt encodes to no tokens");
    const int64_t N = a->samples, V = cfg.vocab_size;
    // step(tokens [N]) → logits [N·V]: N CPU decoders, or one GPU decoder with a batch of N.
    const int64_t max_len = static_cast<int64_t>(prompt.size()) + a->max_new + 1;
    const DecodeStep step = backend(a->device, "nsa generate").decoder(cfg, m.params, N, max_len);
    std::vector<Sampler> samplers;
    for (int64_t i = 0; i < N; ++i) {
      SamplerConfig sc = a->sampler;
      sc.seed += static_cast<uint64_t>(i);
      samplers.emplace_back(sc);
    }
    if (N == 1) std::printf("%s", a->prompt.c_str());
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<float> logits;
    for (uint32_t id : prompt)
      logits = step(std::vector<int32_t>(static_cast<size_t>(N), static_cast<int32_t>(id)));
    const auto t1 = std::chrono::steady_clock::now();
    std::vector<std::string> text(static_cast<size_t>(N));
    std::vector<bool> done(static_cast<size_t>(N), false);
    int64_t produced = 0, steps = 0;
    for (; steps < a->max_new; ++steps) {
      std::vector<int32_t> next(static_cast<size_t>(N), 0);
      bool any = false;
      for (int64_t i = 0; i < N; ++i) {
        if (done[i]) continue;  // finished sequences keep stepping on token 0, ignored
        const std::vector<float> row(logits.begin() + i * V, logits.begin() + (i + 1) * V);
        next[i] = samplers[i].sample(row);
        if (static_cast<uint32_t>(next[i]) == tok->eot()) {
          done[i] = true;
          next[i] = 0;
          continue;
        }
        const std::string piece = tok->decode({static_cast<uint32_t>(next[i])});
        text[i] += piece;
        ++produced;
        any = true;
        if (N == 1) {
          std::printf("%s", piece.c_str());
          std::fflush(stdout);
        }
      }
      if (!any) break;
      if (steps + 1 < a->max_new) logits = step(next);
    }
    const auto t2 = std::chrono::steady_clock::now();
    for (int64_t i = 0; N > 1 && i < N; ++i)
      std::printf("--- sample %lld (seed %llu) ---\n%s%s\n", static_cast<long long>(i),
                  static_cast<unsigned long long>(a->sampler.seed + static_cast<uint64_t>(i)),
                  a->prompt.c_str(), text[i].c_str());
    const double prefill_s = std::chrono::duration<double>(t1 - t0).count();
    const double decode_s = std::chrono::duration<double>(t2 - t1).count();
    std::fprintf(stderr,
                 "\n[%s, step %lld, %s] prefill %zu tokens × %lld in %.2f s; %lld tokens in %.2f s "
                 "(%.1f tok/s, %lld steps)\n",
                 ckpt.c_str(), static_cast<long long>(m.step), a->device.c_str(), prompt.size(),
                 static_cast<long long>(N), prefill_s, static_cast<long long>(produced), decode_s,
                 decode_s > 0 ? static_cast<double>(produced) / decode_s : 0.0,
                 static_cast<long long>(steps));
  });
}

}  // namespace nsa::app
