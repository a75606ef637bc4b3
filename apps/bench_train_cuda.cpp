// Training throughput of the NSA model on one GPU (see bench_train_cuda.h): full optimizer steps
// (forward, backward, AdamW) on synthetic tokens, wall-clock per step after warm-up steps, median.
// Then the per-phase breakdown (bench_phases.h): as many steps again with the phase timer on
// (CUDA events at every change of phase – kept out of the timed steps, so the events cannot
// slow the headline number), their phases and wall time averaged.
// First, before this process allocates on the GPU, the dense PyTorch model of the same shape
// (dense_train_baseline.h) for the table's dense column and NSA / dense ratio.
// Model FLOPs: 6·params per token for the dense parts plus NSA's useful attention FLOPs (forward
// + 2.5× for the backward, as in `nsa bench attention`); MFU against the H100 SXM's 989 TFLOP/s
// of dense bf16. Memory: every allocation of the model (weights, gradients, moments,
// activations, workspaces) and the device memory in use as the driver reports it.
#include "bench_train_cuda.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <vector>

#include "attention_flops.h"
#include "bench_json.h"
#include "bench_phases.h"
#include "cuda/common/cuda_check.h"
#include "dense_baseline.h"
#include "dense_train_baseline.h"
#include "nsa/model_config.h"
#include "train/cuda/train_model_cuda.h"

namespace nsa::app {
namespace {

constexpr double kPeakTflops = 989.0;

double used_device_bytes() {
  size_t free = 0, total = 0;
  NSA_CUDA_CHECK(cudaMemGetInfo(&free, &total));
  return static_cast<double>(total - free);
}

// The dense baseline for every length; a note (not an error) when it cannot run.
DenseTrainBaseline dense_baseline(const TrainBenchArgs& a, const ModelConfig& cfg) {
  DenseTrainBaseline none;
  const std::string script = baseline_script(a.dense_script, exe_dir(), "dense_model_train.py",
                                             "dense PyTorch", "--dense-script", &none.note);
  if (script.empty()) return none;
  const std::string mismatch = dense_train_mismatch(cfg);
  if (!mismatch.empty()) {
    none.note = "dense PyTorch not measured: " + mismatch;
    return none;
  }
  const std::string cmd =
      dense_train_command(a.python, script, cfg, a.seq_lens, a.tokens_per_step, a.steps, a.warmup);
  std::printf("dense baseline: %s\n", cmd.c_str());
  std::fflush(stdout);
  return run_dense_train(cmd, a.seq_lens);
}

}  // namespace

void bench_train_cuda(const TrainBenchArgs& a) {
  ModelConfig cfg = load_model_config(a.config);
  for (const auto& [k, v] : a.overrides) set_model_field(cfg, k, v);
  cfg.validate();
  const std::unique_ptr<std::ofstream> json = open_json_lines(a.json_path);
  const DenseTrainBaseline dense = dense_baseline(a, cfg);
  if (!dense.note.empty()) std::printf("dense baseline: %s\n", dense.note.c_str());
  if (json) {
    for (const std::string& r : dense.records) *json << r << "\n";
  }
  double params = 0;
  {
    ModelParams<float> p = init_model_params<float>(cfg);
    for (const auto& [name, t] : p.named(cfg)) params += static_cast<double>(t->numel());
  }
  std::printf(
      "nsa bench train --device cuda --config %s: %.1fM parameters, vocab %lld, %s, recompute %s\n",
      a.config.c_str(), params / 1e6, static_cast<long long>(cfg.vocab_size),
      cfg.attn.summary().c_str(), recompute_name(a.recompute));
  std::printf("%7s %4s %10s %10s %9s %6s %11s %11s %12s %8s\n", "S", "B", "step ms", "tok/s",
              "TFLOP/s", "MFU", "model MiB", "device MiB", "dense tok/s", "/ dense");
  std::vector<PhaseColumn> phases;
  for (int64_t S : a.seq_lens) {
    const int64_t B = std::max<int64_t>(1, a.tokens_per_step / S);
    const double base = used_device_bytes();
    AdamWConfig adam;
    adam.total_steps = a.warmup + a.steps;
    std::unique_ptr<TrainModel> model =
        cuda::make_train_model_cuda(cfg, SeqLayout::batch(B, S), adam, a.recompute);
    Batch batch;
    batch.inputs.resize(static_cast<size_t>(B * S));
    batch.targets.resize(batch.inputs.size());
    for (size_t i = 0; i < batch.inputs.size(); ++i) {
      batch.inputs[i] = static_cast<int32_t>((i * 2654435761u) % cfg.vocab_size);
      batch.targets[i] = static_cast<int32_t>((i * 40503u + 7) % cfg.vocab_size);
    }
    std::vector<double> ms;
    double loss = 0;
    for (int64_t step = 0; step < a.warmup + a.steps; ++step) {
      const auto t0 = std::chrono::steady_clock::now();
      model->zero_grads();
      loss = model->forward_backward(batch, true, nullptr);
      model->optimizer_step(step, 1.0);
      NSA_CUDA_CHECK(cudaDeviceSynchronize());
      const double t =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      if (step >= a.warmup) ms.push_back(t);
    }
    const double used = used_device_bytes() - base;
    PhaseColumn col;
    col.seq_len = S, col.batch = B;
    if (a.breakdown) {
      model->time_phases(true);
      for (int64_t step = a.warmup + a.steps; step < a.warmup + 2 * a.steps; ++step) {
        const auto t0 = std::chrono::steady_clock::now();
        model->zero_grads();
        model->forward_backward(batch, true, nullptr);
        model->optimizer_step(step, 1.0);
        NSA_CUDA_CHECK(cudaDeviceSynchronize());
        col.step_ms +=
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                .count();
        NSA_CHECK(model->take_phase_times(col.ms), "nsa bench train: no phase times recorded");
      }
      model->time_phases(false);
      for (double& x : col.ms.ms) x /= static_cast<double>(a.steps);
      col.step_ms /= static_cast<double>(a.steps);
      phases.push_back(col);
    }
    std::sort(ms.begin(), ms.end());
    const double step_ms = ms[ms.size() / 2];
    const double tokens = static_cast<double>(B * S);
    const double flops =
        6.0 * params * tokens +
        3.5 * nsa_forward_flops(cfg.layer_attention(S), B, S) * static_cast<double>(cfg.n_layers);
    const double tflops = flops / (step_ms * 1e-3) / 1e12;
    const double model_mib = static_cast<double>(model->device_bytes()) / (1 << 20);
    const double tok_s = tokens / (step_ms * 1e-3);
    const auto d = dense.by_len.find(S);
    const double dense_tok_s = d == dense.by_len.end() ? 0.0 : d->second.tokens_per_s;
    std::printf("%7lld %4lld %10.1f %10.0f %9.1f %5.1f%% %11.0f %11.0f", static_cast<long long>(S),
                static_cast<long long>(B), step_ms, tok_s, tflops, 100.0 * tflops / kPeakTflops,
                model_mib, used / (1 << 20));
    if (dense_tok_s > 0) {
      std::printf(" %12.0f %7.2fx\n", dense_tok_s, tok_s / dense_tok_s);
    } else {
      std::printf(" %12s %8s\n", "-", "-");
    }
    std::fflush(stdout);
    if (json) {
      *json << "{\"bench\":\"train\",\"device\":\"cuda\",\"config\":\"" << a.config
            << "\",\"seq_len\":" << S << ",\"batch\":" << B << ",\"recompute\":\""
            << recompute_name(a.recompute) << "\""
            << ",\"step_ms\":" << step_ms << ",\"tokens_per_s\":" << tok_s
            << ",\"tflops\":" << tflops << ",\"mfu\":" << tflops / kPeakTflops
            << ",\"model_mib\":" << model_mib << ",\"device_used_mib\":" << used / (1 << 20)
            << ",\"loss\":" << loss;
      if (dense_tok_s > 0) {
        *json << ",\"dense_tokens_per_s\":" << dense_tok_s
              << ",\"vs_dense\":" << tok_s / dense_tok_s;
      }
      *json << (a.breakdown ? phase_json_fields(col) : std::string()) << "}\n";
    }
  }
  if (!phases.empty()) {
    std::printf(
        "\nper-phase breakdown of one step (CUDA events; mean of %lld steps after the timed "
        "ones):\n%s",
        static_cast<long long>(a.steps), phase_table(phases).c_str());
  }
}

}  // namespace nsa::app
