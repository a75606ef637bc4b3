// `nsa generate`: text from a checkpoint – the prompt (--prompt, or a long one from --prompt-file)
// through the tokenizer, prefilled in one pass (one batched forward on the GPU, one forward per
// distinct prompt on the CPU), then one token at a time with NSA caches, streamed to stdout, and a
// final line on stderr with the prefill time and the decode tokens/s – on the CPU
// (src/decode/model_decoder.h) or one GPU (src/decode/cuda/model_decoder_cuda.h).
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <memory>
#include <string>

#include "backends.h"
#include "commands.h"
#include "data/tokenizer.h"
#include "decode/sampler.h"
#include "nsa/error.h"
#include "train/checkpoint.h"
#include "train/trainer.h"

namespace nsa::app {
namespace {

// A prompt file is read whole; larger files are refused before reading (a prompt that long would
// not fit any cache we allocate: --max-context caps the tokens).
constexpr int64_t kMaxPromptFileBytes = int64_t{1} << 30;

std::string read_prompt_file(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  NSA_CHECK(fs::exists(path, ec), "--prompt-file '", path, "' does not exist");
  NSA_CHECK(fs::is_regular_file(path, ec), "--prompt-file '", path, "' is not a regular file");
  const auto size = static_cast<int64_t>(fs::file_size(path, ec));
  NSA_CHECK(!ec, "--prompt-file '", path, "': cannot read its size (", ec.message(), ")");
  NSA_CHECK(size <= kMaxPromptFileBytes, "--prompt-file '", path, "' holds ", size,
            " bytes; prompts up to ", kMaxPromptFileBytes, " bytes (1 GiB) are read");
  std::ifstream in(path, std::ios::binary);
  NSA_CHECK(in, "--prompt-file '", path, "' cannot be opened for reading");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  NSA_CHECK(!in.bad(), "--prompt-file '", path, "': read error");
  NSA_CHECK(!text.empty(), "--prompt-file '", path,
            "' is empty (a prompt needs at least one token)");
  return text;
}

}  // namespace

void register_generate_command(CLI::App& app) {
  struct Args {
    std::string checkpoint, run, prompt = "The", prompt_file, sp_model, device = "cpu";
    int64_t max_new = 200, samples = 1, max_context = int64_t{1} << 20;
    SamplerConfig sampler;
  };
  auto a = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand("generate", "Generate text from a checkpoint");
  cmd->add_option("--checkpoint", a->checkpoint, "a ckpt_* folder");
  cmd->add_option("--run", a->run, "a run folder: its newest complete checkpoint");
  CLI::Option* prompt_opt = cmd->add_option("--prompt", a->prompt, "prompt text");
  cmd->add_option("--prompt-file", a->prompt_file,
                  "read the prompt from this file (a long prompt; not echoed to stdout)")
      ->excludes(prompt_opt);
  cmd->add_option("--max-context", a->max_context,
                  "most tokens a sequence may hold, prompt + generated (sizes the caches)")
      ->check(CLI::Range(int64_t{1}, (int64_t{1} << 31) - 2));
  cmd->add_option("--sp-model", a->sp_model, "SentencePiece model (default: bytes, vocab 256)");
  cmd->add_option("--max-new", a->max_new, "tokens to generate (0: the prefill alone)")
      ->check(CLI::Range(int64_t{0}, int64_t{2147483646}));
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
    // Without --sp-model the text is bytes: a model with a larger vocabulary was trained on
    // another tokenizer's ids, and its ids past 255 would print as nothing.
    NSA_CHECK(!a->sp_model.empty() || cfg.vocab_size <= 256, "checkpoint '", ckpt,
              "' has a vocabulary of ", cfg.vocab_size,
              " tokens, and without --sp-model the text is bytes (256): pass --sp-model, the "
              "SentencePiece model its data was prepared with (e.g. data/corpus/tokenizer.model)");
    auto tok =
        a->sp_model.empty() ? data::make_byte_tokenizer() : data::load_sentencepiece(a->sp_model);
    NSA_CHECK(tok->vocab_size() <= cfg.vocab_size, "the tokenizer's vocabulary (",
              tok->vocab_size(), ") exceeds the model's (", cfg.vocab_size, ")");
    const bool from_file = !a->prompt_file.empty();
    const std::string prompt_text = from_file ? read_prompt_file(a->prompt_file) : a->prompt;
    const std::vector<uint32_t> prompt = tok->encode(prompt_text);
    if (from_file) {
      NSA_CHECK(!prompt.empty(), "--prompt-file '", a->prompt_file, "' encodes to no tokens");
    } else {
      NSA_CHECK(!prompt.empty(), "--prompt encodes to no tokens");
    }
    const int64_t S = static_cast<int64_t>(prompt.size());
    NSA_CHECK(S + a->max_new <= a->max_context, from_file ? "--prompt-file" : "--prompt", " (", S,
              " tokens) + --max-new ", a->max_new, " exceed --max-context ", a->max_context,
              " tokens per sequence; shorten the prompt or raise --max-context");
    const int64_t N = a->samples, V = cfg.vocab_size;
    // prefill(prompts [N]) and step(tokens [N]) → logits [N·V]: N CPU decoders, or one GPU
    // decoder with a batch of N.
    const int64_t max_len = S + a->max_new + 1;
    const Decoder dec = backend(a->device, "nsa generate").decoder(cfg, m.params, N, max_len);
    std::vector<Sampler> samplers;
    for (int64_t i = 0; i < N; ++i) {
      SamplerConfig sc = a->sampler;
      sc.seed += static_cast<uint64_t>(i);
      samplers.emplace_back(sc);
    }
    if (from_file) {
      std::fprintf(stderr, "[prefilling %lld tokens of %s: %s]\n", static_cast<long long>(S),
                   a->prompt_file.c_str(), dec.prefill_kind.c_str());
    } else if (N == 1) {
      std::printf("%s", prompt_text.c_str());
      std::fflush(stdout);
    }
    const auto t0 = std::chrono::steady_clock::now();
    const std::vector<int32_t> ids(prompt.begin(), prompt.end());
    std::vector<float> logits =
        dec.prefill(std::vector<std::vector<int32_t>>(static_cast<size_t>(N), ids));
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
      if (steps + 1 < a->max_new) logits = dec.step(next);
    }
    const auto t2 = std::chrono::steady_clock::now();
    for (int64_t i = 0; N > 1 && i < N; ++i)
      std::printf("--- sample %lld (seed %llu) ---\n%s%s\n", static_cast<long long>(i),
                  static_cast<unsigned long long>(a->sampler.seed + static_cast<uint64_t>(i)),
                  from_file ? "" : prompt_text.c_str(), text[i].c_str());
    std::fflush(stdout);
    const double prefill_s = std::chrono::duration<double>(t1 - t0).count();
    const double decode_s = std::chrono::duration<double>(t2 - t1).count();
    // The N samples share one prompt: it is prefilled once and its caches copied.
    std::fprintf(stderr,
                 "\n[%s, step %lld, %s] prefill %lld tokens in %.3f s (%.0f tok/s, %s%s); "
                 "decode %lld tokens in %.3f s (%.1f tok/s, %lld steps)\n",
                 ckpt.c_str(), static_cast<long long>(m.step), a->device.c_str(),
                 static_cast<long long>(S), prefill_s,
                 prefill_s > 0 ? static_cast<double>(S) / prefill_s : 0.0, dec.prefill_kind.c_str(),
                 N > 1 ? (", copied to " + std::to_string(N) + " samples").c_str() : "",
                 static_cast<long long>(produced), decode_s,
                 decode_s > 0 ? static_cast<double>(produced) / decode_s : 0.0,
                 static_cast<long long>(steps));
  });
}

}  // namespace nsa::app
