// The training loop (see trainer.h).
#include "trainer.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "checkpoint.h"
#include "loss_plot.h"
#include "model/model_cpu.h"
#include "nsa/error.h"
#include "token_loader.h"
#include "watchdog.h"

namespace nsa {
namespace fs = std::filesystem;

double validation_loss(const ModelConfig& cfg, const ModelParams<float>& params,
                       const std::string& data, int64_t batches, int64_t batch, int64_t S) {
  TokenLoader val(data, "val", cfg.vocab_size, cfg.seed);
  double sum = 0;
  for (int64_t i = 0; i < batches; ++i) {
    const Batch b = val.next(batch, S);
    sum += model_loss_cpu<float>(cfg, params, SeqLayout::batch(batch, S), b.inputs, b.targets,
                                 nullptr);
  }
  return sum / static_cast<double>(batches);
}

LoadedModel load_model_checkpoint(const std::string& checkpoint) {
  const TrainState st = read_checkpoint_state(checkpoint);
  LoadedModel m;
  for (const auto& [k, v] : st.model_config) set_model_field(m.cfg, k, v);
  m.cfg.validate();
  m.params = init_model_params<float>(m.cfg);
  load_model_weights(checkpoint, m.params.named(m.cfg));
  m.step = st.step;
  return m;
}

EvalResult evaluate_checkpoint(const std::string& checkpoint, const std::string& data,
                               int64_t batches, int64_t batch, int64_t seq_len) {
  const LoadedModel m = load_model_checkpoint(checkpoint);
  const int64_t S = seq_len > 0 ? seq_len : m.cfg.seq_len;
  EvalResult r;
  r.loss = validation_loss(m.cfg, m.params, data, batches, batch, S);
  r.ppl = std::exp(r.loss);
  r.step = m.step;
  r.tokens = batches * batch * S;
  return r;
}

namespace {

// The inputs of rank r: sequences [r·B, (r+1)·B) of the global batch.
Batch rank_slice(const Batch& global, int rank, int64_t tokens) {
  Batch b;
  b.inputs.assign(global.inputs.begin() + rank * tokens,
                  global.inputs.begin() + (rank + 1) * tokens);
  b.targets.assign(global.targets.begin() + rank * tokens,
                   global.targets.begin() + (rank + 1) * tokens);
  return b;
}

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

// Mean validation loss through a training backend: the same global batches of world·B sequences
// as one process with batch world·B would see, each rank taking its slice.
double validation_loss(TrainModel& model, Communicator& comm, const ModelConfig& cfg,
                       const std::string& data, int64_t batches, int64_t batch, int64_t S) {
  TokenLoader val(data, "val", cfg.vocab_size, cfg.seed);
  const int world = comm.world();
  double sum = 0;
  for (int64_t i = 0; i < batches; ++i) {
    const Batch global = val.next(batch * world, S);
    sum += model.forward_backward(world > 1 ? rank_slice(global, comm.rank(), batch * S) : global,
                                  false, nullptr);
  }
  comm.allreduce_sum(&sum, 1);
  return sum / static_cast<double>(batches * world);
}

}  // namespace

TrainResult train(const TrainOptions& o) {
  std::unique_ptr<Communicator> local;
  if (!o.comm) local = make_local_communicator();
  Communicator& comm = o.comm ? *o.comm : *local;
  const int rank = comm.rank(), world = comm.world();
  const bool lead = rank == 0;
  ModelConfig cfg = load_model_config(o.config);
  for (const auto& [k, v] : o.overrides) set_model_field(cfg, k, v);
  cfg.validate();
  const int64_t S = o.seq_len > 0 ? o.seq_len : cfg.seq_len;
  NSA_CHECK(o.steps > 0 && o.batch > 0 && o.grad_accum > 0,
            "--steps, --batch and --grad-accum must be positive");
  const std::vector<uint64_t> prints = comm.allgather(run_fingerprint(cfg, o, S));
  for (int r = 1; r < world; ++r) {
    NSA_CHECK(prints[r] == prints[0], "rank ", r, " was started with a different model config or ",
              "training options than rank 0: every rank must get the same flags and config file");
  }
  if (lead) fs::create_directories(o.out_dir);
  comm.barrier();

  AdamWConfig ac = o.adam;
  ac.total_steps = o.steps;
  const SeqLayout layout = SeqLayout::batch(o.batch, S);
  std::unique_ptr<TrainModel> model = o.model_factory
                                          ? o.model_factory(cfg, layout, ac, o.recompute)
                                          : make_train_model_cpu(cfg, layout, ac, o.recompute);
  const bool on_cpu = std::string(model->device()) == "cpu";
  NSA_CHECK(!o.anomaly || on_cpu, "--anomaly checks every tensor on the host: use --device cpu");
  const NamedTensors named = model->named_params();
  TokenLoader loader(o.data, "train", cfg.vocab_size, cfg.seed);

  int64_t start = 0;
  if (o.resume) {
    const std::string ckpt = latest_checkpoint(o.out_dir);
    if (!ckpt.empty()) {
      const TrainState st = load_checkpoint(ckpt, named, model->adam_m(), model->adam_v());
      NSA_CHECK(st.model_config == model_config_fields(cfg), "checkpoint '", ckpt,
                "' was written for a different model config; resume with the same config");
      model->push();
      start = st.step;
      loader.set_position(st.train_position);
      if (!o.quiet && lead)
        std::printf("resumed from %s at step %lld\n", ckpt.c_str(), static_cast<long long>(start));
    }
  }
  if (start == 0 && !o.init_from.empty()) {
    const std::string ckpt = fs::is_regular_file(fs::path(o.init_from) / "COMPLETE")
                                 ? o.init_from
                                 : latest_checkpoint(o.init_from);
    NSA_CHECK(!ckpt.empty(), "--init-from '", o.init_from,
              "' is neither a complete checkpoint nor a run folder that holds one");
    // The same shapes and attention; `branches` may differ (e.g. a window-only ablation that
    // starts from the same first stage).
    auto theirs = read_checkpoint_state(ckpt).model_config;
    auto ours = model_config_fields(cfg);
    theirs.erase("branches");
    ours.erase("branches");
    NSA_CHECK(theirs == ours, "--init-from '", ckpt, "' was written for a different model config; ",
              "use the same --config and --set fields (only --branches may differ)");
    load_model_weights(ckpt, named);
    model->push();
    if (!o.quiet && lead) std::printf("initialised from %s\n", ckpt.c_str());
  }
  if (o.zero1 && world > 1) model->shard_optimizer_state(comm);
  Watchdog watchdog(o.watchdog_s,
                    (fs::path(o.out_dir) /
                     (world > 1 ? "stacks.rank" + std::to_string(rank) + ".txt" : "stacks.txt"))
                        .string());
  // Multi-rank: each rank records its step and phase in heartbeat.rank<r>, so a watchdog that
  // fires while waiting in a collective can name the rank that is behind.
  int64_t cur_step = start;
  const auto progress = [&](const char* phase) {
    watchdog.progress(phase);
    if (world > 1) {
      std::ofstream(fs::path(o.out_dir) / ("heartbeat.rank" + std::to_string(rank)))
          << cur_step + 1 << " " << phase << "\n";
    }
  };
  if (world > 1) {
    watchdog.set_stall_note([&o, world, rank] {
      std::string behind;
      std::vector<std::string> states(static_cast<size_t>(world));
      for (int r = 0; r < world; ++r) {
        std::ifstream f(fs::path(o.out_dir) / ("heartbeat.rank" + std::to_string(r)));
        std::getline(f, states[r]);
      }
      for (int r = 0; r < world; ++r) {
        if (r != rank && states[r] != states[rank]) {
          behind += str(behind.empty() ? "" : ", ", "rank ", r, " at step/phase '", states[r], "'");
        }
      }
      return behind.empty()
                 ? std::string()
                 : str(" (this is rank ", rank, " at '", states[rank], "'; ", behind, ")");
    });
  }
  std::ofstream metrics;
  if (lead) {
    metrics.open(fs::path(o.out_dir) / "metrics.jsonl",
                 start > 0 ? std::ios::app : std::ios::trunc);
  }
  TrainResult r;
  for (int64_t step = start; step < o.steps; ++step) {
    cur_step = step;
    const auto t0 = std::chrono::steady_clock::now();
    model->zero_grads();
    double loss = 0;
    ModelStats stats;
    stats.check_finite = o.anomaly;
    for (int64_t micro = 0; micro < o.grad_accum; ++micro) {
      progress("data");
      const Batch global = loader.next(o.batch * world, S);
      progress("forward+backward");
      loss += model->forward_backward(world > 1 ? rank_slice(global, rank, o.batch * S) : global,
                                      true, &stats);
    }
    if (rank == o.fault_rank && step + 1 == o.fault_step) {
      if (o.fault == "exit") std::_Exit(17);
      if (o.fault == "stall") std::this_thread::sleep_for(std::chrono::hours(1));
    }
    if (world > 1) {
      progress("gradient all-reduce");
      model->allreduce_grads(comm);
      comm.allreduce_sum(&loss, 1);
      loss /= static_cast<double>(world);
    }
    progress("optimizer");
    loss /= static_cast<double>(o.grad_accum);
    NSA_CHECK(std::isfinite(loss), "non-finite loss ", loss, " at step ", step,
              ": stopping (lower the learning rate, or rerun with --anomaly to name the first bad "
              "tensor)");
    const double gnorm =
        model->optimizer_step(step, 1.0 / static_cast<double>(o.grad_accum * world));
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    const double tok_s = static_cast<double>(o.batch * S * o.grad_accum * world) / (ms / 1e3);
    const double mem_mib =
        static_cast<double>(on_cpu ? host_memory_stats().current_bytes : model->device_bytes()) /
        (1 << 20);
    r.last_loss = loss;
    r.steps_done = step + 1;
    std::ostringstream line;
    line.precision(9);
    line << "{\"step\":" << step + 1 << ",\"loss\":" << loss << ",\"lr\":" << lr_at(ac, step)
         << ",\"grad_norm\":" << gnorm << ",\"tokens_per_s\":" << tok_s << ",\"step_ms\":" << ms
         << ",\"device\":\"" << model->device() << "\",\"world\":" << world
         << ",\"memory_mib\":" << mem_mib << ",\"gate_mean\":{\"cmp\":" << stats.gate_mean[kCmp]
         << ",\"sel\":" << stats.gate_mean[kSel] << ",\"win\":" << stats.gate_mean[kWin] << "}";
    const auto list = [&line](const char* key, const auto& v, double scale) {
      line << ",\"" << key << "\":[";
      for (size_t i = 0; i < v.size(); ++i)
        line << (i ? "," : "") << static_cast<double>(v[i]) * scale;
      line << "]";
    };
    list("layer_forward_ms", stats.layer_forward_ms, 1.0);
    list("layer_backward_ms", stats.layer_backward_ms, 1.0);
    list("layer_mib", stats.layer_bytes, 1.0 / (1 << 20));
    if (on_cpu) {
      line << ",\"sel_distance_hist\":[";
      for (int k = 0; k < 16; ++k) line << (k ? "," : "") << stats.sel_distance_hist[k];
      line << "]";
    }
    const bool do_val = o.val_every > 0 && ((step + 1) % o.val_every == 0 || step + 1 == o.steps);
    if (do_val) {
      progress("validation");
      r.last_val_loss = validation_loss(*model, comm, cfg, o.data, o.val_batches, o.batch, S);
      line << ",\"val_loss\":" << r.last_val_loss << ",\"val_ppl\":" << std::exp(r.last_val_loss);
    }
    line << "}";
    if (lead) {
      metrics << line.str() << "\n" << std::flush;
      std::ofstream(fs::path(o.out_dir) / "heartbeat") << step + 1 << "\n";
    }
    if (!o.quiet && lead) {
      std::printf(
          "step %5lld/%lld | loss %.4f | lr %.2e | grad %.3f | %.0f tok/s | %.0f ms | %.0f MiB%s\n",
          static_cast<long long>(step + 1), static_cast<long long>(o.steps), loss, lr_at(ac, step),
          gnorm, tok_s, ms, mem_mib, do_val ? str(" | val ", r.last_val_loss).c_str() : "");
      std::fflush(stdout);
    }
    const bool stop = o.stop_after > 0 && step + 1 - start >= o.stop_after;
    if ((o.ckpt_every > 0 && (step + 1) % o.ckpt_every == 0) || step + 1 == o.steps || stop) {
      progress("checkpoint");
      model->pull();  // on every rank: with ZeRO-1 it gathers the moments
      if (lead) {     // the replicas are identical: rank 0 writes for all
        TrainState st{step + 1, loader.position(), model_config_fields(cfg)};
        save_checkpoint(o.out_dir, st, named, model->adam_m(), model->adam_v(),
                        static_cast<int>(o.keep));
      }
      comm.barrier();  // a rank that stops or resumes next finds the checkpoint complete
    }
    if (stop) break;
  }
  if (lead) {
    write_loss_plot((fs::path(o.out_dir) / "metrics.jsonl").string(),
                    (fs::path(o.out_dir) / "loss.svg").string());
  }
  return r;
}

}  // namespace nsa
