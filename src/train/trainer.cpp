// The training loop (see trainer.h), and evaluation of checkpoints.
#include "trainer.h"

#include <algorithm>

#include <cmath>

#include "checkpoint.h"
#include "model/model_cpu.h"
#include "token_loader.h"
#include "train_periodic.h"
#include "train_run.h"
#include "train_step.h"

namespace nsa {

namespace {

double mean_loss(const ModelConfig& cfg, const ModelParams<float>& params, TokenLoader& val,
                 int64_t batches, int64_t batch, int64_t S) {
  double sum = 0;
  for (int64_t i = 0; i < batches; ++i) {
    const Batch b = val.next(batch, S);
    sum += model_loss_cpu<float>(cfg, params, SeqLayout::batch(batch, S), b.inputs, b.targets,
                                 nullptr);
  }
  return sum / static_cast<double>(batches);
}

}  // namespace

double validation_loss(const ModelConfig& cfg, const ModelParams<float>& params,
                       const std::string& data, int64_t batches, int64_t batch, int64_t S) {
  TokenLoader val(data, "val", cfg.vocab_size, cfg.seed);
  return mean_loss(cfg, params, val, batches, batch, S);
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
  // No token counted twice: past the split's distinct batches the loader would wrap.
  TokenLoader val(data, "val", m.cfg.vocab_size, m.cfg.seed);
  r.batches = std::min(batches, std::max<int64_t>(1, val.distinct_batches(batch, S)));
  r.loss = mean_loss(m.cfg, m.params, val, r.batches, batch, S);
  r.ppl = std::exp(r.loss);
  r.step = m.step;
  r.tokens = r.batches * batch * S;
  return r;
}

// Set-up, the step loop and the periodic work live in train_run, train_step and train_periodic.
TrainResult train(const TrainOptions& o) {
  TrainRun run = set_up_run(o);
  RunMonitor monitor(o, run);
  TrainResult r;
  r.start = run.start;
  for (int64_t step = run.start; step < o.steps; ++step) {
    monitor.set_step(step);
    const StepResult s = run_step(o, run, monitor, step);
    if (monitor.after_step(run, step, s, r)) break;
  }
  monitor.finish(run);
  return r;
}

}  // namespace nsa
