// `nsa eval`: validation loss and perplexity of a checkpoint (its own config and weights), or its
// needle-retrieval accuracy by context length and depth (--task needle).
#include <cstdio>
#include <memory>

#include "backends.h"
#include "commands.h"
#include "data/needle.h"
#include "nsa/error.h"
#include "nsa/size_limits.h"
#include "train/checkpoint.h"
#include "train/needle_eval.h"
#include "train/trainer.h"

namespace nsa::app {

namespace {

// --batches, --batch and --seq-len in range, and a batch's logits within this machine's memory.
void check_eval_sizes(int64_t batches, int64_t batch, int64_t seq_len) {
  NSA_CHECK(batches >= 1 && batches <= (1 << 30), "--batches = ", batches,
            " must be in [1, 1073741824]");
  NSA_CHECK(batch >= 1 && batch <= (1 << 30), "--batch = ", batch, " must be in [1, 1073741824]");
  NSA_CHECK(seq_len >= 0 && seq_len <= 2147483647, "--seq-len = ", seq_len,
            " must be in [0, 2147483647] (0: the checkpoint config's seq_len)");
  const std::string what = "a batch (--batch × --seq-len tokens)";
  check_memory(checked_product({batch, seq_len, 8}, what), what);
}

}  // namespace

void register_eval_command(CLI::App& app) {
  struct Args {
    std::string checkpoint, run, data;
    int64_t batches = 20, batch = 8, seq_len = 0;
    std::string task = "loss", device = "cpu";
    std::vector<int64_t> seq_lens = {1024, 4096, 16384};
    std::vector<double> depths = {0.0, 0.25, 0.5, 0.75, 1.0};
    int64_t samples = 20;
    std::string filler = "cycle";
  };
  auto a = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand("eval", "Validation loss / perplexity of a checkpoint");
  cmd->add_option("--checkpoint", a->checkpoint, "a ckpt_* folder");
  cmd->add_option("--run", a->run, "a run folder: its newest complete checkpoint");
  cmd->add_option("--task", a->task, "loss (validation loss) or needle (retrieval accuracy)")
      ->check(CLI::IsMember({"loss", "needle"}));
  cmd->add_option("--data", a->data, "folder with val_*.bin shards (or 'synthetic'); task loss");
  cmd->add_option("--seq-lens", a->seq_lens, "needle: context lengths")->delimiter(',');
  cmd->add_option("--depths", a->depths, "needle: depths in [0, 1]")->delimiter(',');
  cmd->add_option("--samples", a->samples, "needle: sequences per (length, depth)");
  cmd->add_option("--filler", a->filler,
                  "needle: the haystack, cycle (16 tokens repeating) or random symbols");
  cmd->add_option("--device", a->device, "needle: cpu (the reference) or cuda (one GPU)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  cmd->add_option("--batches", a->batches, "validation batches");
  cmd->add_option("--batch", a->batch, "sequences per batch");
  cmd->add_option("--seq-len", a->seq_len, "tokens per sequence (default: the config's)");
  cmd->callback([a] {
    const std::string ckpt = resolve_checkpoint(a->checkpoint, a->run);
    if (a->task == "needle") {
      const LogitRowsFn logit_rows = backend(a->device, "nsa eval").logit_rows;
      const NeedleFiller filler = parse_needle_filler(a->filler, "--filler");
      const std::vector<NeedleCell> cells =
          evaluate_needle(ckpt, a->seq_lens, a->depths, a->samples, logit_rows, filler);
      std::printf("needle retrieval of %s (%s filler, %lld samples per cell; accuracy)\n%8s",
                  ckpt.c_str(), needle_filler_name(filler), static_cast<long long>(a->samples),
                  "S \\ depth");
      for (double d : a->depths) std::printf(" %7.2f", d);
      for (size_t i = 0; i < cells.size(); ++i) {
        if (i % a->depths.size() == 0)
          std::printf("\n%8lld", static_cast<long long>(cells[i].seq_len));
        std::printf(" %7.2f", cells[i].accuracy());
      }
      std::printf("\n");
      for (const NeedleCell& c : cells) {
        std::printf(
            "{\"task\":\"needle\",\"filler\":\"%s\",\"seq_len\":%lld,\"depth\":%.4f,"
            "\"samples\":%lld,\"retrieved\":%lld,\"accuracy\":%.4f,\"value_token_accuracy\":%.4f}"
            "\n",
            needle_filler_name(filler), static_cast<long long>(c.seq_len), c.depth,
            static_cast<long long>(c.samples), static_cast<long long>(c.retrieved), c.accuracy(),
            static_cast<double>(c.value_tokens_right) /
                static_cast<double>(c.samples * kNeedleValueLen));
      }
      return;
    }
    NSA_CHECK(!a->data.empty(), "nsa eval: --data is required for --task loss");
    check_eval_sizes(a->batches, a->batch, a->seq_len);
    const EvalResult r = evaluate_checkpoint(ckpt, a->data, a->batches, a->batch, a->seq_len);
    std::printf("%s (step %lld): val loss %.4f, perplexity %.3f over %lld tokens\n", ckpt.c_str(),
                static_cast<long long>(r.step), r.loss, r.ppl, static_cast<long long>(r.tokens));
    std::printf("{\"checkpoint\":\"%s\",\"step\":%lld,\"val_loss\":%.6f,\"val_ppl\":%.6f}\n",
                ckpt.c_str(), static_cast<long long>(r.step), r.loss, r.ppl);
  });
}

}  // namespace nsa::app
