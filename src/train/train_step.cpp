// One optimizer step (see train_step.h).
#include "train_step.h"

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <thread>

#include "nsa/error.h"
#include "train_periodic.h"

namespace nsa {

StepResult run_step(const TrainOptions& o, TrainRun& run, RunMonitor& monitor, int64_t step) {
  const int64_t S = run.seq_len;
  const auto t0 = std::chrono::steady_clock::now();
  StepResult s;
  run.model->zero_grads();
  s.stats.check_finite = o.anomaly;
  for (int64_t micro = 0; micro < o.grad_accum; ++micro) {
    monitor.progress("data");
    const Batch global = run.loader->next(o.batch * run.world, S);
    monitor.progress("forward+backward");
    if (run.world > 1 && micro == o.grad_accum - 1) run.model->begin_gradient_sum(*run.comm);
    s.loss += run.model->forward_backward(
        run.world > 1 ? rank_slice(global, run.rank, o.batch * S) : global, true, &s.stats);
  }
  if (run.rank == o.fault_rank && step + 1 == o.fault_step) {
    if (o.fault == "exit") std::_Exit(17);
    if (o.fault == "stall") std::this_thread::sleep_for(std::chrono::hours(1));
  }
  if (run.world > 1) {
    monitor.progress("gradient all-reduce");
    run.model->allreduce_grads(*run.comm);
    run.comm->allreduce_sum(&s.loss, 1);
    s.loss /= static_cast<double>(run.world);
  }
  monitor.progress("optimizer");
  s.loss /= static_cast<double>(o.grad_accum);
  NSA_CHECK(std::isfinite(s.loss), "non-finite loss ", s.loss, " at step ", step + 1,
            ": stopping (lower the learning rate, or rerun with --anomaly to name the first bad "
            "tensor)");
  s.grad_norm =
      run.model->optimizer_step(step, 1.0 / static_cast<double>(o.grad_accum * run.world));
  // A finite loss with a non-finite gradient has just made the weights non-finite: stop at this
  // step (its checkpoint is not written), not at the next loss.
  NSA_CHECK(std::isfinite(s.grad_norm), "non-finite gradient norm ", s.grad_norm, " at step ",
            step + 1, " (the loss was ", s.loss,
            "): stopping (lower the learning rate, or rerun with --anomaly to name the first bad "
            "tensor)");
  s.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  s.tokens_per_s = static_cast<double>(o.batch * S * o.grad_accum * run.world) / (s.ms / 1e3);
  return s;
}

}  // namespace nsa
