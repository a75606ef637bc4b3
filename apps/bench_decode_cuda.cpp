// The decode benchmark on one GPU (see bench_decode_cuda.h). For each context S and batch B: the
// model's decode step (a captured CUDA graph: embedding, every layer, LM head) with NSA caches and
// with dense attention, timed over back-to-back steps after warm-up (CUDA events, mean per step);
// the attention alone (n_layers decode-attention steps in one graph) against the faster of our
// dense attention and PyTorch SDPA (bench/dense_decode.py, run first in the same call: the same
// shape, n_layers calls in one CUDA graph); and the K/V bytes a step reads – the paper's access
// model for NSA, (S − l)/d + n_sel·l_sel + w tokens per group, against S for dense. The caches
// hold random K/V (the cost of a step does not depend on their values). Then the batched prefill
// of random prompts, wall time from the host (workspace allocation included).
#include "bench_decode_cuda.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <random>
#include <vector>

#include "bench_json.h"
#include "cuda/common/cuda_check.h"
#include "cuda/common/device_buffer.h"
#include "cuda/nsa/nsa_decode.h"
#include "decode/cuda/model_decoder_cuda.h"
#include "decode_trace_report.h"
#include "dense_baseline.h"
#include "nsa/model_config.h"

namespace nsa::app {
namespace {

using cuda::bf16;

// Milliseconds per call of `launch` (which enqueues on `stream`), over `steps` after `warmup`.
template <typename F>
double ms_per_call(cudaStream_t stream, int64_t warmup, int64_t steps, F&& launch) {
  for (int64_t i = 0; i < warmup; ++i) launch();
  cudaEvent_t t0, t1;
  NSA_CUDA_CHECK(cudaEventCreate(&t0));
  NSA_CUDA_CHECK(cudaEventCreate(&t1));
  NSA_CUDA_CHECK(cudaEventRecord(t0, stream));
  for (int64_t i = 0; i < steps; ++i) launch();
  NSA_CUDA_CHECK(cudaEventRecord(t1, stream));
  NSA_CUDA_CHECK(cudaEventSynchronize(t1));
  float ms = 0;
  NSA_CUDA_CHECK(cudaEventElapsedTime(&ms, t0, t1));
  cudaEventDestroy(t0);
  cudaEventDestroy(t1);
  return ms / static_cast<double>(steps);
}

constexpr int kTracedSteps = 3;  // replays of a traced graph; the last one's marks are read

// The attention of one model step alone: n_layers decode steps of one layer at context S – or,
// `distinct`, of n_layers layers with caches of their own – captured as one graph (the position
// stays at S; each replay rewrites the same cache row), with random caches and queries. With
// `trace` (NSA), then a graph of the same steps with the phase timestamps on, run kTracedSteps
// times: the last replay's layers land in *trace, a slot each. *plan: the layer's kernels and paths
// (NsaDecodeCuda::plan).
double attention_ms(const ModelConfig& cfg, int64_t B, int64_t S, bool dense, bool distinct,
                    int64_t warmup, int64_t steps, cuda::NsaDecodeCuda::Trace* trace,
                    std::string* plan) {
  const NsaConfig& a = cfg.attn;
  std::vector<std::unique_ptr<cuda::NsaDecodeCuda>> layers;
  for (int64_t i = 0; i < (distinct ? cfg.n_layers : 1); ++i)
    layers.push_back(std::make_unique<cuda::NsaDecodeCuda>(a, B, S + 1, dense));
  cuda::NsaDecodeCuda& layer = *layers[0];
  *plan = layer.plan();
  cudaStream_t st;
  NSA_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  for (size_t i = 0; i < layers.size(); ++i) layers[i]->fill_random(S, 7 + i, st);
  cuda::DeviceBuffer<int32_t> pos(B);
  const std::vector<int32_t> p(static_cast<size_t>(B), static_cast<int32_t>(S));
  pos.upload(p.data(), B);
  cuda::DeviceBuffer<bf16> q(B * a.heads * a.dk), o(B * a.heads * a.dv), k(B * a.groups * a.dk),
      v(B * a.groups * a.dv), g(B * a.heads);
  k.zero(), v.zero(), g.zero();
  // Random queries (uniform in [−2, 2)), so that the blocks' selection scores differ as in a model:
  // zero queries give every block the same score, and the top-n's ranking an easy case of ties.
  cuda::launch_fill_uniform(q.get(), B * a.heads * a.dk, 0x9e3779b97f4a7c15ull, 2.0f, st);
  const bf16* kp[3] = {k.get(), k.get(), k.get()};
  const bf16* vp[3] = {v.get(), v.get(), v.get()};
  const bf16* gp[3] = {g.get(), g.get(), g.get()};
  const auto capture = [&] {
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    NSA_CUDA_CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    for (int64_t i = 0; i < cfg.n_layers; ++i)
      layers[static_cast<size_t>(i) % layers.size()]->step(q.get(), kp, vp, gp, pos.get(), o.get(),
                                                           st);
    NSA_CUDA_CHECK(cudaStreamEndCapture(st, &graph));
    NSA_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    cudaGraphDestroy(graph);
    return exec;
  };
  cudaGraphExec_t exec = capture();
  const double ms =
      ms_per_call(st, warmup, steps, [&] { NSA_CUDA_CHECK(cudaGraphLaunch(exec, st)); });
  cudaGraphExecDestroy(exec);
  if (trace && !dense) {
    layer.enable_trace(st, cfg.n_layers);
    exec = capture();
    for (int i = 0; i < kTracedSteps; ++i) NSA_CUDA_CHECK(cudaGraphLaunch(exec, st));
    *trace = layer.trace();
    cudaGraphExecDestroy(exec);
  }
  cudaStreamDestroy(st);
  return ms;
}

struct Measured {
  double step_ms = 0, attn_ms = 0, kv_bytes = 0, cache_gib = 0;
  std::string plan;  // the attention's kernels and paths (NsaDecodeCuda::plan)
  // With --trace (NSA): the attention alone (its layers in one graph) and inside the model's step.
  cuda::NsaDecodeCuda::Trace trace, step_trace;
};

Measured measure(const ModelConfig& cfg, const ModelParams<float>& params, int64_t B, int64_t S,
                 bool dense, const DecodeBenchArgs& a) {
  Measured m;
  {
    const bool traced = a.trace && !dense;
    cuda::ModelDecoderCuda dec(cfg, params, B,
                               S + a.warmup + a.steps + (traced ? kTracedSteps : 0) + 1, dense);
    dec.fill_random(S, 11);
    m.kv_bytes = static_cast<double>(dec.kv_bytes_per_step());
    m.cache_gib = static_cast<double>(dec.device_bytes()) / (1u << 30);
    m.step_ms = ms_per_call(dec.stream(), a.warmup, a.steps, [&] { dec.step_async(); });
    if (traced) {  // the same step with the phase timestamps on, after the timed ones
      dec.enable_trace();
      for (int i = 0; i < kTracedSteps; ++i) dec.step_async();
      m.step_trace = dec.trace();
    }
  }
  m.attn_ms = attention_ms(cfg, B, S, dense, a.distinct_layers, a.warmup, a.steps,
                           a.trace ? &m.trace : nullptr, &m.plan);
  return m;
}

// The SDPA baseline for every (context, batch), before this process allocates anything on the
// GPU; a note (not an error) when it cannot run.
SdpaBaseline sdpa_baseline(const DecodeBenchArgs& a, const ModelConfig& cfg) {
  SdpaBaseline none;
  const std::string script = baseline_script(a.sdpa_script, exe_dir(), "dense_decode.py", "SDPA",
                                             "--sdpa-script", &none.note);
  if (script.empty()) return none;
  const NsaConfig& c = cfg.attn;
  if (c.dk != c.dv) {
    none.note = "SDPA not measured: the script takes one head dim, the model has dk " +
                std::to_string(c.dk) + " and dv " + std::to_string(c.dv);
    return none;
  }
  SdpaShape shape;
  shape.heads = c.heads, shape.groups = c.groups, shape.head_dim = c.dk;
  shape.layers = cfg.n_layers, shape.steps = a.steps, shape.warmup = a.warmup;
  shape.distinct_layers = a.distinct_layers;
  const std::string cmd = dense_decode_command(a.python, script, a.contexts, a.batches, shape);
  std::printf("dense baseline: %s\n", cmd.c_str());
  std::fflush(stdout);
  return run_dense_decode(cmd);
}

// Wall milliseconds of prefilling `count` random prompts of `len` tokens (median of reps, after
// one untimed run): the decoder is built once, reset between runs.
double prefill_ms(const ModelConfig& cfg, const ModelParams<float>& params, int64_t len,
                  int64_t count, int64_t reps) {
  cuda::ModelDecoderCuda dec(cfg, params, count, len + 1, false);
  std::mt19937 rng(3);
  std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(cfg.vocab_size - 1));
  std::vector<std::vector<int32_t>> prompts(static_cast<size_t>(count));
  for (auto& p : prompts) {
    p.resize(static_cast<size_t>(len));
    for (auto& t : p) t = tok(rng);
  }
  std::vector<double> ms;
  for (int64_t r = 0; r <= reps; ++r) {
    dec.reset();
    const auto t0 = std::chrono::steady_clock::now();
    dec.prefill(prompts);
    const double elapsed =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (r > 0) ms.push_back(elapsed);
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

}  // namespace

void bench_decode_cuda(const DecodeBenchArgs& a) {
  const ModelConfig cfg = load_model_config(a.model);
  cfg.validate();
  const NsaConfig& c = cfg.attn;
  const ModelParams<float> params = init_model_params<float>(cfg);
  const std::unique_ptr<std::ofstream> json = open_json_lines(a.json_path);
  std::printf(
      "nsa bench decode --device cuda --model %s: %lld layers, vocab %lld, %s; bf16 caches, "
      "mean of %lld steps (CUDA graphs)\n",
      a.model.c_str(), static_cast<long long>(cfg.n_layers), static_cast<long long>(cfg.vocab_size),
      c.summary().c_str(), static_cast<long long>(a.steps));
  const SdpaBaseline sdpa = sdpa_baseline(a, cfg);
  if (!sdpa.note.empty()) std::printf("dense baseline: %s\n", sdpa.note.c_str());
  if (json) {
    for (const std::string& r : sdpa.records) *json << r << "\n";
  }
  std::printf(
      "attention ms per step (%lld layers%s): NSA, ours dense, SDPA's best, and the dense column = "
      "the faster of the two, by which\n",
      static_cast<long long>(cfg.n_layers),
      a.distinct_layers ? ", caches of their own" : ", one layer's caches each");
  std::printf("%8s %3s | %9s %9s %7s | %9s %9s %9s %9s %-6s %7s | %10s %10s %6s %10s | %9s\n",
              "context", "B", "NSA ms", "dense ms", "speedup", "NSA attn", "our dense", "SDPA",
              "dense", "by", "speedup", "NSA KV MiB", "formula", "ratio", "dense MiB", "NSA tok/s");
  struct TracedStep {
    int64_t context, batch;
    cuda::NsaDecodeCuda::Trace trace, step_trace;
  };
  std::vector<TracedStep> traces;
  std::vector<std::string> plans;  // "context B: plan", printed after the table
  for (const int64_t S : a.contexts) {
    for (const int64_t B : a.batches) {
      Measured n = measure(cfg, params, B, S, false, a);
      const Measured d = measure(cfg, params, B, S, true, a);
      if (a.trace) traces.push_back({S, B, std::move(n.trace), std::move(n.step_trace)});
      plans.push_back(std::to_string(S) + " B" + std::to_string(B) + ": " + n.plan);
      const auto it = sdpa.best.find({S, B});
      const SdpaResult* sd = it == sdpa.best.end() ? nullptr : &it->second;
      const DenseChoice best = faster_dense(d.attn_ms, sd);
      // The paper's model: (S − l)/d + n_sel·l_sel + w tokens per group, layer and sequence.
      const double formula_tokens = static_cast<double>(S - c.l) / static_cast<double>(c.d) +
                                    static_cast<double>(c.n_sel * c.l_sel + c.w);
      const double formula =
          formula_tokens * static_cast<double>(B * cfg.n_layers * c.groups * (c.dk + c.dv) * 2);
      const double mib = 1024.0 * 1024.0;
      char sdpa_col[32] = "-";
      if (sd) std::snprintf(sdpa_col, sizeof(sdpa_col), "%.3f", sd->ms);
      std::printf(
          "%8lld %3lld | %9.3f %9.3f %6.2fx | %9.3f %9.3f %9s %9.3f %-6s %6.2fx | %10.2f %10.2f "
          "%6.3f %10.1f | %9.0f\n",
          static_cast<long long>(S), static_cast<long long>(B), n.step_ms, d.step_ms,
          d.step_ms / n.step_ms, n.attn_ms, d.attn_ms, sdpa_col, best.ms, best.by.c_str(),
          best.ms / n.attn_ms, n.kv_bytes / mib, formula / mib, n.kv_bytes / formula,
          d.kv_bytes / mib, static_cast<double>(B) * 1e3 / n.step_ms);
      std::fflush(stdout);
      if (json) {
        *json << "{\"bench\":\"decode\",\"device\":\"cuda\",\"model\":\"" << a.model
              << "\",\"distinct_layers\":" << (a.distinct_layers ? "true" : "false")
              << ",\"context\":" << S << ",\"batch\":" << B << ",\"nsa_step_ms\":" << n.step_ms
              << ",\"dense_step_ms\":" << d.step_ms << ",\"nsa_attention_ms\":" << n.attn_ms
              << ",\"dense_attention_ms\":" << d.attn_ms;
        if (sd) {
          *json << ",\"sdpa_attention_ms\":" << sd->ms << ",\"sdpa_backend\":\"" << sd->backend
                << "\",\"sdpa_layout\":\"" << sd->layout
                << "\",\"sdpa_graph\":" << (sd->graph ? "true" : "false");
        }
        *json << ",\"nsa_plan\":\"" << n.plan << "\",\"dense_best_attention_ms\":" << best.ms
              << ",\"dense_best_by\":\"" << best.by << "\",\"nsa_kv_bytes\":" << n.kv_bytes
              << ",\"formula_kv_bytes\":" << formula << ",\"dense_kv_bytes\":" << d.kv_bytes
              << ",\"nsa_device_gib\":" << n.cache_gib << ",\"dense_device_gib\":" << d.cache_gib
              << "}\n";
      }
    }
  }
  std::printf("NSA attention's kernels (CTAs and paths):\n");
  for (const std::string& p : plans) std::printf("  %s\n", p.c_str());
  for (const TracedStep& t : traces) {
    report_decode_trace(t.trace, "attention", t.context, t.batch, json.get());
    report_decode_trace(t.step_trace, "step", t.context, t.batch, json.get());
  }
  if (a.prefill.empty()) return;
  std::printf(
      "\nbatched prefill (one forward per group of prompts, caches filled directly; wall time, "
      "median of %lld after one untimed run)\n",
      static_cast<long long>(a.prefill_reps));
  std::printf("%10s %7s %12s %10s %12s\n", "prompt", "prompts", "tokens", "ms", "tok/s");
  for (const auto& [len, count] : a.prefill) {
    const double ms = prefill_ms(cfg, params, len, count, a.prefill_reps);
    const double tokens = static_cast<double>(len * count);
    std::printf("%10lld %7lld %12.0f %10.1f %12.0f\n", static_cast<long long>(len),
                static_cast<long long>(count), tokens, ms, tokens * 1e3 / ms);
    std::fflush(stdout);
    if (json) {
      *json << "{\"bench\":\"prefill\",\"device\":\"cuda\",\"model\":\"" << a.model
            << "\",\"prompt_tokens\":" << len << ",\"prompts\":" << count << ",\"ms\":" << ms
            << ",\"tokens_per_s\":" << tokens * 1e3 / ms << "}\n";
    }
  }
}

}  // namespace nsa::app
