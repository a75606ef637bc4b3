// `nsa train`: train an NSA language model on the CPU or one GPU (see src/train/trainer.h).
#include <cmath>
#include <cstdio>
#include <memory>

#include "backends.h"
#include "commands.h"
#include "dist/communicator.h"
#include "dist/tcp_communicator.h"
#include "launch_ranks.h"
#include "nsa/error.h"
#include "nsa/recompute.h"
#include "train/trainer.h"

namespace nsa::app {

void register_train_command(CLI::App& app) {
  auto o = std::make_shared<TrainOptions>();
  auto sets = std::make_shared<std::vector<std::string>>();
  CLI::App* cmd = app.add_subcommand("train", "Train an NSA language model");
  cmd->add_option("--config", o->config, "model config (YAML)");
  cmd->add_option("--set", *sets, "override a config field: --set n_sel=8 (repeatable)");
  auto branches = std::make_shared<std::string>();
  CLI::Option* branches_flag = cmd->add_option(
      "--branches", *branches, "NSA branches that contribute, e.g. sel,win (diagnostics)");
  auto attention = std::make_shared<std::string>();
  CLI::Option* attention_flag = cmd->add_option(
      "--attention", *attention,
      "nsa (default), full (causal dense attention: the window branch alone with w >= S) or "
      "window (the window branch alone at the config's w); also the config field `attention`");
  cmd->add_option(
      "--data", o->data,
      "folder of train_*/val_*.bin shards, 'synthetic', 'repeat', or recall rows: "
      "'copy', 'needle[:N]', 'needle-random[:N]' (N needles per sequence, cycle or "
      "random filler), 'needle-short', 'needle-random-short' (one needle task of a random length "
      "at the row's start), 'needle-mix:N' (with copy rows); kinds joined by '+' take turns");
  cmd->add_option("--out", o->out_dir, "run folder: metrics.jsonl, heartbeat, checkpoints");
  cmd->add_option("--steps", o->steps, "optimizer steps");
  cmd->add_option("--batch", o->batch, "sequences per micro-batch");
  cmd->add_option("--seq-len", o->seq_len, "tokens per sequence (default: the config's)");
  cmd->add_option("--grad-accum", o->grad_accum, "micro-batches per step");
  cmd->add_option("--lr", o->adam.lr, "peak learning rate");
  CLI::Option* min_lr_flag = cmd->add_option("--min-lr", o->adam.min_lr,
                                             "learning rate at the end of the cosine (default: "
                                             "--lr / 10; at most --lr)");
  cmd->add_option("--warmup", o->adam.warmup, "warm-up steps");
  cmd->add_option("--weight-decay", o->adam.weight_decay, "AdamW weight decay (matrices)");
  cmd->add_option("--clip", o->adam.clip, "global gradient-norm clip (0: off)");
  cmd->add_option("--val-every", o->val_every, "validation every N steps (0: off)");
  cmd->add_option("--val-batches", o->val_batches, "batches per validation");
  cmd->add_option("--ckpt-every", o->ckpt_every, "checkpoint every N steps (and at the end)");
  cmd->add_option("--keep", o->keep, "checkpoints to keep");
  cmd->add_option("--watchdog", o->watchdog_s,
                  "seconds without progress before stacks are dumped and the run exits (0: off)");
  cmd->add_flag("--anomaly", o->anomaly,
                "check every activation and gradient for NaN/Inf and name the first bad tensor");
  cmd->add_flag("--resume", o->resume, "continue from the newest complete checkpoint in --out");
  cmd->add_flag("--overwrite", o->overwrite,
                "start afresh in an --out that holds a run (its metrics and checkpoints go)");
  cmd->add_option("--init-from", o->init_from,
                  "start from the weights of this checkpoint (or run folder's newest) with a "
                  "fresh optimizer at step 0: a curriculum's next stage, fine-tuning");
  cmd->add_option("--stop-after", o->stop_after,
                  "stop (with a checkpoint) after this many steps of this run (0: never)");
  auto device = std::make_shared<std::string>("cpu");
  cmd->add_option("--device", *device,
                  "cpu (the reference), cuda (one GPU per rank) or auto (the GPU when one is "
                  "usable, else the CPU)")
      ->check(CLI::IsMember({"cpu", "cuda", "auto"}));
  auto recompute = std::make_shared<std::string>("none");
  cmd->add_option("--recompute", *recompute,
                  "GPU: what the backward recomputes – none (keep everything), ops (the norms, "
                  "the residual sum and the MLP's up-projections: less memory, a few % slower) "
                  "or layers (whole layers; a bare --recompute)")
      ->expected(0, 1);
  cmd->add_flag("--zero1", o->zero1,
                "with several ranks: shard the AdamW moments over them (ZeRO-1)");
  auto nproc = std::make_shared<int>(1);
  cmd->add_option("--nproc", *nproc,
                  "data-parallel ranks on this machine (re-runs the command under mpirun)")
      ->check(CLI::Range(1, 1024));
  cmd->add_option("--fault", o->fault, "test only: 'exit' or 'stall' at --fault-step")->group("");
  cmd->add_option("--fault-rank", o->fault_rank, "test only: the rank that fails")->group("");
  cmd->add_option("--fault-step", o->fault_step, "test only: the step it fails at")->group("");
  cmd->callback([o, sets, branches, branches_flag, attention, attention_flag, device, nproc,
                 recompute, min_lr_flag] {
    if (min_lr_flag->count() == 0) o->adam.min_lr = o->adam.lr / 10;  // follows a lowered --lr
    // Checked before anything starts, so the message names the flag (the config field's own
    // check names `attention`).
    NSA_CHECK(attention_flag->count() == 0 || *attention == "nsa" || *attention == "full" ||
                  *attention == "window",
              "--attention '", *attention, "' is not one of: ", kAttentionModes,
              " (nsa: all three branches; full: causal dense attention; window: the window "
              "branch alone)");
    o->recompute = parse_recompute(*recompute);
    // torchrun (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT): TCP; mpirun, Slurm, PMI: MPI.
    const bool torchrun = launched_by_torchrun();
    const bool parallel = !torchrun && launched_as_parallel_job();
    if (*nproc > 1 && !parallel && !torchrun) relaunch_as_ranks(*nproc);
    std::unique_ptr<Communicator> comm;
    if (torchrun) {
      comm = make_tcp_communicator();
      o->comm = comm.get();
    } else if (parallel) {
      comm = make_mpi_communicator_if_built();
      o->comm = comm.get();
    }
    const Backend b = backend(*device, "nsa train");
    o->model_factory = b.train_model;
    if (!comm || comm->rank() == 0) {
      std::printf("nsa train: device %s\n", b.describe().c_str());
      std::fflush(stdout);
    }
    if (branches_flag->count() > 0) o->overrides["branches"] = *branches;  // '' is refused
    if (attention_flag->count() > 0) o->overrides["attention"] = *attention;
    for (const std::string& s : *sets) {
      const size_t eq = s.find('=');
      NSA_CHECK(eq != std::string::npos && eq > 0, "--set '", s, "' must look like field=value");
      o->overrides[s.substr(0, eq)] = s.substr(eq + 1);
    }
    const TrainResult r = train(*o);
    if (comm && comm->rank() != 0) return;
    if (r.steps_done == 0 && r.start > 0) {
      std::printf("nothing to train: %s is at step %lld, at or past --steps %lld\n",
                  o->out_dir.c_str(), static_cast<long long>(r.start),
                  static_cast<long long>(o->steps));
      return;
    }
    char val[48] = "no validation";
    if (!std::isnan(r.last_val_loss))
      std::snprintf(val, sizeof val, "val loss %.4f", r.last_val_loss);
    std::printf("trained %lld steps: loss %.4f, %s -> %s\n", static_cast<long long>(r.steps_done),
                r.last_loss, val, o->out_dir.c_str());
  });
}

}  // namespace nsa::app
