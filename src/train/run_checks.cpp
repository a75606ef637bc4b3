// Start-up checks of a training run (see run_checks.h).
#include "run_checks.h"

#include <cmath>

#include "checkpoint_state.h"
#include "nsa/error.h"
#include "nsa/size_limits.h"

namespace nsa {
namespace {

void check_range(const char* flag, int64_t v, int64_t lo, int64_t hi, const char* note = "") {
  NSA_CHECK(lo <= v && v <= hi, flag, " = ", v, " must be in [", lo, ", ", hi, "]", note);
}

// A split must hold one global batch of B·S + 1 tokens (generated sources always do).
void check_split(const TokenLoader& split, const char* name, const TrainOptions& o, int64_t need) {
  NSA_CHECK(split.synthetic() || split.num_tokens() > need, "--data '", o.data, "': the ", name,
            " split has ", split.num_tokens(), " tokens, fewer than one batch of ", need + 1,
            " (--batch × ranks × seq_len + 1): lower --batch or --seq-len, or add data");
}

}  // namespace

void check_run_options(const TrainOptions& o, const ModelConfig& cfg, int64_t seq_len, int world) {
  constexpr int64_t kBig = int64_t{1} << 30;
  check_range("--steps", o.steps, 1, kMaxCheckpointStep);
  check_range("--batch", o.batch, 1, kBig);
  check_range("--seq-len", o.seq_len, 0, 2147483647, " (0: the config's seq_len)");
  check_range("--grad-accum", o.grad_accum, 1, kBig);
  check_range("--warmup", o.adam.warmup, 0, kMaxCheckpointStep);
  check_range("--val-every", o.val_every, 0, kMaxCheckpointStep, " (0: no validation)");
  check_range("--val-batches", o.val_batches, 1, kBig);
  check_range("--ckpt-every", o.ckpt_every, 0, kMaxCheckpointStep, " (0: only at the end)");
  check_range("--keep", o.keep, 0, kBig, " (0: keep every checkpoint)");
  check_range("--stop-after", o.stop_after, 0, kMaxCheckpointStep, " (0: never)");
  check_finite_non_negative("--lr", o.adam.lr);
  check_finite_non_negative("--min-lr", o.adam.min_lr);
  NSA_CHECK(o.adam.min_lr <= o.adam.lr, "--min-lr = ", o.adam.min_lr,
            " must be at most --lr = ", o.adam.lr, " (the cosine decays from --lr to --min-lr)");
  check_finite_non_negative("--weight-decay", o.adam.weight_decay);
  check_finite_non_negative("--clip", o.adam.clip);
  check_finite_non_negative("--watchdog", o.watchdog_s);
  // A global batch's tokens and, on the host, a micro-batch's logits (a lower bound of what the
  // CPU model holds; the GPU model checks its own allocations).
  const std::string what = "a batch (--batch × ranks × --seq-len tokens)";
  const int64_t tokens = checked_product({o.batch, world, seq_len}, what);
  check_memory(checked_product({tokens, 8}, what), what);
  const std::string logits = "a micro-batch's logits (--batch × --seq-len × vocab_size floats)";
  check_memory(checked_product({o.batch, seq_len, cfg.vocab_size, 4}, logits), logits);
}

void check_run_data(const TrainOptions& o, const TrainRun& run) {
  const int64_t need = run.world * o.batch * run.seq_len;
  check_split(*run.loader, "train", o, need);
  if (o.val_every > 0) {
    const TokenLoader val(o.data, "val", run.cfg.vocab_size, run.cfg.seed);
    check_split(val, "val", o, need);
  }
}

}  // namespace nsa
