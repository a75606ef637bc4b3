// The periodic work of a training run (see train_periodic.h).
#include "train_periodic.h"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "checkpoint.h"
#include "loss_plot.h"
#include "nsa/error.h"

namespace nsa {
namespace fs = std::filesystem;
namespace {

std::string stacks_path(const TrainOptions& o, int rank, int world) {
  return (fs::path(o.out_dir) /
          (world > 1 ? "stacks.rank" + std::to_string(rank) + ".txt" : "stacks.txt"))
      .string();
}

// A number as JSON: null where it is not finite (JSON has no nan or inf; a diverging run's line
// must still parse, for plot and resume).
struct JsonNumber {
  double x;
};
std::ostream& operator<<(std::ostream& os, JsonNumber n) {
  return std::isfinite(n.x) ? os << n.x : os << "null";
}

// metrics.jsonl's line of one step, without validation and the closing brace.
std::string metrics_line(const TrainRun& run, int64_t step, const StepResult& s, double mem_mib) {
  const ModelStats& stats = s.stats;
  using N = JsonNumber;
  std::ostringstream line;
  line.precision(9);
  line << "{\"step\":" << step + 1 << ",\"loss\":" << N{s.loss}
       << ",\"lr\":" << N{lr_at(run.adam, step)} << ",\"grad_norm\":" << N{s.grad_norm}
       << ",\"tokens_per_s\":" << N{s.tokens_per_s} << ",\"step_ms\":" << N{s.ms}
       << ",\"device\":\"" << run.model->device() << "\",\"world\":" << run.world
       << ",\"memory_mib\":" << N{mem_mib} << ",\"gate_mean\":{\"cmp\":" << N{stats.gate_mean[kCmp]}
       << ",\"sel\":" << N{stats.gate_mean[kSel]} << ",\"win\":" << N{stats.gate_mean[kWin]} << "}";
  const auto list = [&line](const char* key, const auto& v, double scale) {
    line << ",\"" << key << "\":[";
    for (size_t i = 0; i < v.size(); ++i)
      line << (i ? "," : "") << N{static_cast<double>(v[i]) * scale};
    line << "]";
  };
  list("layer_forward_ms", stats.layer_forward_ms, 1.0);
  list("layer_backward_ms", stats.layer_backward_ms, 1.0);
  list("layer_mib", stats.layer_bytes, 1.0 / (1 << 20));
  line << ",\"sel_distance_hist\":[";
  for (int k = 0; k < 16; ++k) line << (k ? "," : "") << stats.sel_distance_hist[k];
  line << "]";
  return line.str();
}

}  // namespace

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

RunMonitor::RunMonitor(const TrainOptions& o, const TrainRun& run)
    : o_(o),
      rank_(run.rank),
      world_(run.world),
      step_(run.start),
      watchdog_(o.watchdog_s, stacks_path(o, run.rank, run.world)) {
  if (world_ > 1) {
    watchdog_.set_stall_note([&o, world = world_, rank = rank_] {
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
  if (run.lead) {
    metrics_.open(fs::path(o.out_dir) / "metrics.jsonl",
                  run.start > 0 ? std::ios::app : std::ios::trunc);
  }
}

void RunMonitor::progress(const char* phase) {
  watchdog_.progress(phase);
  if (world_ > 1) {
    std::ofstream(fs::path(o_.out_dir) / ("heartbeat.rank" + std::to_string(rank_)))
        << step_ + 1 << " " << phase << "\n";
  }
}

bool RunMonitor::after_step(TrainRun& run, int64_t step, const StepResult& s, TrainResult& r) {
  const TrainOptions& o = o_;
  const double mem_mib = static_cast<double>(run.on_cpu ? host_memory_stats().current_bytes
                                                        : run.model->device_bytes()) /
                         (1 << 20);
  r.last_loss = s.loss;
  r.steps_done = step + 1;
  std::string line = metrics_line(run, step, s, mem_mib);
  const bool do_val = o.val_every > 0 && ((step + 1) % o.val_every == 0 || step + 1 == o.steps);
  if (do_val) {
    progress("validation");
    r.last_val_loss = validation_loss(*run.model, *run.comm, run.cfg, o.data, o.val_batches,
                                      o.batch, run.seq_len);
    std::ostringstream val;
    val.precision(9);
    val << ",\"val_loss\":" << JsonNumber{r.last_val_loss}
        << ",\"val_ppl\":" << JsonNumber{std::exp(r.last_val_loss)};
    line += val.str();
  }
  line += "}";
  if (run.lead) {
    metrics_ << line << "\n" << std::flush;
    NSA_CHECK(metrics_, "writing '", o.out_dir, "/metrics.jsonl' failed (disk full?)");
    std::ofstream(fs::path(o.out_dir) / "heartbeat") << step + 1 << "\n";
  }
  if (!o.quiet && run.lead) {
    std::printf(
        "step %5lld/%lld | loss %.4f | lr %.2e | grad %.3f | %.0f tok/s | %.0f ms | %.0f MiB%s\n",
        static_cast<long long>(step + 1), static_cast<long long>(o.steps), s.loss,
        lr_at(run.adam, step), s.grad_norm, s.tokens_per_s, s.ms, mem_mib,
        do_val ? str(" | val ", r.last_val_loss).c_str() : "");
    std::fflush(stdout);
  }
  const bool stop = o.stop_after > 0 && step + 1 - run.start >= o.stop_after;
  if ((o.ckpt_every > 0 && (step + 1) % o.ckpt_every == 0) || step + 1 == o.steps || stop) {
    progress("checkpoint");
    run.model->pull();  // on every rank: with ZeRO-1 it gathers the moments
    if (run.lead) {     // the replicas are identical: rank 0 writes for all
      TrainState st{step + 1, run.loader->position(), model_config_fields(run.cfg)};
      save_checkpoint(o.out_dir, st, run.named, run.model->adam_m(), run.model->adam_v(),
                      static_cast<int>(o.keep));
    }
    run.comm->barrier();  // a rank that stops or resumes next finds the checkpoint complete
  }
  return stop;
}

void RunMonitor::finish(const TrainRun& run) {
  if (run.lead) {
    write_loss_plot((fs::path(o_.out_dir) / "metrics.jsonl").string(),
                    (fs::path(o_.out_dir) / "loss.svg").string());
  }
}

}  // namespace nsa
