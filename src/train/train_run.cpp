// The set-up of a training run (see train_run.h).
#include "train_run.h"

#include <cstdio>
#include <filesystem>
#include <map>
#include <sstream>
#include <string>

#include "checkpoint.h"
#include "checkpoint_state.h"
#include "io/paths.h"
#include "nsa/error.h"
#include "run_checks.h"

namespace nsa {
namespace fs = std::filesystem;
namespace {

// Everything that must agree across ranks, hashed: the model config and the training options.
uint64_t run_fingerprint(const ModelConfig& cfg, const TrainOptions& o, int64_t S) {
  std::ostringstream os;
  for (const auto& [k, v] : model_config_fields(cfg)) os << k << '=' << v << ';';
  os << "data=" << o.data << ";steps=" << o.steps << ";batch=" << o.batch << ";seq=" << S
     << ";accum=" << o.grad_accum << ";lr=" << o.adam.lr << ";min_lr=" << o.adam.min_lr
     << ";warmup=" << o.adam.warmup << ";wd=" << o.adam.weight_decay << ";clip=" << o.adam.clip
     << ";resume=" << o.resume << ";out=" << o.out_dir << ";zero1=" << o.zero1
     << ";init=" << o.init_from;
  return std::hash<std::string>{}(os.str());
}

// The first field (by name) whose value differs between a checkpoint's config and this run's:
// "field: checkpoint's value, this run's value".
std::string first_difference(const std::map<std::string, std::string>& theirs,
                             const std::map<std::string, std::string>& ours) {
  for (const auto& [k, v] : ours) {
    const auto it = theirs.find(k);
    if (it == theirs.end()) return str(k, ": absent there, ", v, " here");
    if (it->second != v) return str(k, " = ", it->second, " there, ", v, " here");
  }
  for (const auto& [k, v] : theirs) {
    if (ours.count(k) == 0) return str(k, " = ", v, " there, unknown here");
  }
  return "none";
}

// --resume: the newest complete checkpoint of out_dir, if any, into the model, optimizer and
// loader; returns the step to continue from (0 when there is none – said on the console, so that
// a start from step 1 is not mistaken for a continuation).
int64_t resume(const TrainOptions& o, TrainRun& run) {
  const std::string ckpt = latest_checkpoint(o.out_dir);
  if (ckpt.empty()) {
    if (!o.quiet && run.lead)
      std::printf("--resume: '%s' holds no complete checkpoint; starting at step 1\n",
                  o.out_dir.c_str());
    return 0;
  }
  const TrainState st = load_checkpoint(ckpt, run.named, run.model->adam_m(), run.model->adam_v());
  const auto ours = model_config_fields(run.cfg);
  NSA_CHECK(st.model_config == ours, "checkpoint '", ckpt,
            "' was written for a different model config (", first_difference(st.model_config, ours),
            "); resume with the same config and --set fields");
  run.model->push();
  check_resume_position(st, *run.loader, ckpt);
  run.loader->set_position(st.train_position);
  if (run.lead) truncate_metrics(o.out_dir, st.step);
  if (!o.quiet && run.lead)
    std::printf("resumed from %s at step %lld\n", ckpt.c_str(), static_cast<long long>(st.step));
  return st.step;
}

// --init-from: another run's weights with a fresh optimizer at step 0.
void init_from(const TrainOptions& o, TrainRun& run) {
  const std::string ckpt = fs::is_regular_file(fs::path(o.init_from) / "COMPLETE")
                               ? o.init_from
                               : latest_checkpoint(o.init_from);
  NSA_CHECK(!ckpt.empty(), "--init-from '", o.init_from,
            "' is neither a complete checkpoint nor a run folder that holds one");
  // The same shapes and attention; `branches` may differ (e.g. a window-only ablation that
  // starts from the same first stage).
  auto theirs = read_checkpoint_state(ckpt).model_config;
  auto ours = model_config_fields(run.cfg);
  theirs.erase("branches");
  ours.erase("branches");
  NSA_CHECK(theirs == ours, "--init-from '", ckpt, "' was written for a different model config (",
            first_difference(theirs, ours),
            "); use the same --config and --set fields (only --branches may differ)");
  load_model_weights(ckpt, run.named);
  run.model->push();
  if (!o.quiet && run.lead) std::printf("initialised from %s\n", ckpt.c_str());
}

}  // namespace

Batch rank_slice(const Batch& global, int rank, int64_t tokens) {
  Batch b;
  b.inputs.assign(global.inputs.begin() + rank * tokens,
                  global.inputs.begin() + (rank + 1) * tokens);
  b.targets.assign(global.targets.begin() + rank * tokens,
                   global.targets.begin() + (rank + 1) * tokens);
  return b;
}

TrainRun set_up_run(const TrainOptions& o) {
  TrainRun run;
  // Ranks.
  if (!o.comm) run.local = make_local_communicator();
  run.comm = o.comm ? o.comm : run.local.get();
  Communicator& comm = *run.comm;
  run.rank = comm.rank(), run.world = comm.world();
  run.lead = run.rank == 0;
  // Config, and the ranks' agreement on it.
  run.cfg = load_model_config(o.config);
  for (const auto& [k, v] : o.overrides) set_model_field(run.cfg, k, v);
  run.cfg.validate();
  run.seq_len = o.seq_len > 0 ? o.seq_len : run.cfg.seq_len;
  check_run_options(o, run.cfg, run.seq_len, run.world);
  if (run.lead && !o.quiet) {
    const std::string& at = run.cfg.attention;
    const std::string what =
        at == "nsa"    ? "branches " + run.cfg.branches
        : at == "full" ? std::string("causal dense: the window branch alone, covering all S")
                       : str("the window branch alone, w = ", run.cfg.attn.w);
    std::printf("attention: %s (%s)\n", at.c_str(), what.c_str());
  }
  const std::vector<uint64_t> prints = comm.allgather(run_fingerprint(run.cfg, o, run.seq_len));
  for (int r = 1; r < run.world; ++r) {
    NSA_CHECK(prints[r] == prints[0], "rank ", r, " was started with a different model config or ",
              "training options than rank 0: every rank must get the same flags and config file");
  }
  if (run.lead) run.folder = open_run_folder(o.out_dir, o.resume, o.overwrite);
  if (run.lead && !run.folder.old_outputs.empty() && !o.init_from.empty()) {
    // --overwrite would clear the checkpoint the new run starts from.
    NSA_CHECK(!io::lies_within(io::normal_path(o.init_from), io::normal_path(o.out_dir)),
              "--init-from '", o.init_from, "' lies in --out '", o.out_dir,
              "', whose old run --overwrite would clear: copy the checkpoint elsewhere first, or "
              "pass a new --out");
  }
  comm.barrier();
  // The model backend and the data.
  run.adam = o.adam;
  run.adam.total_steps = o.steps;
  const SeqLayout layout = SeqLayout::batch(o.batch, run.seq_len);
  run.model = o.model_factory ? o.model_factory(run.cfg, layout, run.adam, o.recompute)
                              : make_train_model_cpu(run.cfg, layout, run.adam, o.recompute);
  run.on_cpu = std::string(run.model->device()) == "cpu";
  run.named = run.model->named_params();
  run.loader = std::make_unique<TokenLoader>(o.data, "train", run.cfg.vocab_size, run.cfg.seed);
  check_run_data(o, run);
  // Where the run starts.
  if (o.resume) run.start = resume(o, run);
  if (run.start == 0 && !o.init_from.empty()) init_from(o, run);
  if (o.zero1 && run.world > 1) run.model->shard_optimizer_state(comm);
  if (o.zero1 && run.world == 1 && !o.quiet) {
    std::printf(
        "--zero1: one rank holds all of the optimizer state; it shards only over several "
        "(--nproc N)\n");
  }
  // --overwrite: the old run goes only now that the new one's inputs have been checked.
  if (run.lead) run.folder.clear_old_run();
  comm.barrier();
  return run;
}

}  // namespace nsa
