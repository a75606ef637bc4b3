// `nsa eval`: validation loss and perplexity of a checkpoint (its own config and weights).
#include <cstdio>
#include <memory>

#include "commands.h"
#include "nsa/error.h"
#include "train/checkpoint.h"
#include "train/trainer.h"

namespace nsa::app {

void register_eval_command(CLI::App& app) {
  struct Args {
    std::string checkpoint, run, data;
    int64_t batches = 20, batch = 8, seq_len = 0;
  };
  auto a = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand("eval", "Validation loss / perplexity of a checkpoint");
  cmd->add_option("--checkpoint", a->checkpoint, "a ckpt_* folder");
  cmd->add_option("--run", a->run, "a run folder: its newest complete checkpoint");
  cmd->add_option("--data", a->data, "folder with val_*.bin shards (or 'synthetic')")->required();
  cmd->add_option("--batches", a->batches, "validation batches");
  cmd->add_option("--batch", a->batch, "sequences per batch");
  cmd->add_option("--seq-len", a->seq_len, "tokens per sequence (default: the config's)");
  cmd->callback([a] {
    const std::string ckpt = resolve_checkpoint(a->checkpoint, a->run);
    const EvalResult r = evaluate_checkpoint(ckpt, a->data, a->batches, a->batch, a->seq_len);
    std::printf("%s (step %lld): val loss %.4f, perplexity %.3f over %lld tokens\n", ckpt.c_str(),
                static_cast<long long>(r.step), r.loss, r.ppl, static_cast<long long>(r.tokens));
    std::printf("{\"checkpoint\":\"%s\",\"step\":%lld,\"val_loss\":%.6f,\"val_ppl\":%.6f}\n",
                ckpt.c_str(), static_cast<long long>(r.step), r.loss, r.ppl);
  });
}

}  // namespace nsa::app
