// The decode benchmark on one GPU (see bench_decode_cuda.h). For each context S and batch B: the
// model's decode step (a captured CUDA graph: embedding, every layer, LM head) with NSA caches and
// with dense attention, timed over back-to-back steps after warm-up (CUDA events, mean per step);
// the attention alone (n_layers decode-attention steps in one graph); and the K/V bytes a step
// reads – the paper's access model for NSA, (S − l)/d + n_sel·l_sel + w tokens per group, against
// S for dense. The caches hold random K/V (the cost of a step does not depend on their values).
#include "bench_decode_cuda.h"

#include <cuda_runtime.h>

#include <cstdio>
#include <fstream>
#include <memory>

#include "cuda/common/cuda_check.h"
#include "cuda/common/device_buffer.h"
#include "cuda/nsa/nsa_decode.h"
#include "decode/cuda/model_decoder_cuda.h"
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

// The attention of one model step alone: n_layers decode steps of one layer at context S,
// captured as one graph (the position stays at S; each replay rewrites the same cache row).
double attention_ms(const ModelConfig& cfg, int64_t B, int64_t S, bool dense, int64_t warmup,
                    int64_t steps) {
  const NsaConfig& a = cfg.attn;
  cuda::NsaDecodeCuda layer(a, B, S + 1, dense);
  cudaStream_t st;
  NSA_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  layer.fill_random(S, 7, st);
  cuda::DeviceBuffer<int32_t> pos(B);
  const std::vector<int32_t> p(static_cast<size_t>(B), static_cast<int32_t>(S));
  pos.upload(p.data(), B);
  cuda::DeviceBuffer<bf16> q(B * a.heads * a.dk), o(B * a.heads * a.dv), k(B * a.groups * a.dk),
      v(B * a.groups * a.dv), g(B * a.heads);
  q.zero(), k.zero(), v.zero(), g.zero();
  const bf16* kp[3] = {k.get(), k.get(), k.get()};
  const bf16* vp[3] = {v.get(), v.get(), v.get()};
  const bf16* gp[3] = {g.get(), g.get(), g.get()};
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  NSA_CUDA_CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
  for (int64_t i = 0; i < cfg.n_layers; ++i)
    layer.step(q.get(), kp, vp, gp, pos.get(), o.get(), st);
  NSA_CUDA_CHECK(cudaStreamEndCapture(st, &graph));
  NSA_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  const double ms =
      ms_per_call(st, warmup, steps, [&] { NSA_CUDA_CHECK(cudaGraphLaunch(exec, st)); });
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(st);
  return ms;
}

struct Measured {
  double step_ms = 0, attn_ms = 0, kv_bytes = 0, cache_gib = 0;
};

Measured measure(const ModelConfig& cfg, const ModelParams<float>& params, int64_t B, int64_t S,
                 bool dense, const DecodeBenchArgs& a) {
  Measured m;
  {
    cuda::ModelDecoderCuda dec(cfg, params, B, S + a.warmup + a.steps + 1, dense);
    dec.fill_random(S, 11);
    m.kv_bytes = static_cast<double>(dec.kv_bytes_per_step());
    m.cache_gib = static_cast<double>(dec.device_bytes()) / (1u << 30);
    m.step_ms = ms_per_call(dec.stream(), a.warmup, a.steps, [&] { dec.step_async(); });
  }
  m.attn_ms = attention_ms(cfg, B, S, dense, a.warmup, a.steps);
  return m;
}

}  // namespace

void bench_decode_cuda(const DecodeBenchArgs& a) {
  const ModelConfig cfg = load_model_config(a.model);
  cfg.validate();
  const NsaConfig& c = cfg.attn;
  const ModelParams<float> params = init_model_params<float>(cfg);
  std::unique_ptr<std::ofstream> json;
  if (!a.json_path.empty()) json = std::make_unique<std::ofstream>(a.json_path);
  std::printf(
      "nsa bench decode --device cuda --model %s: %lld layers, vocab %lld, %s; bf16 caches, "
      "mean of %lld steps (CUDA graphs)\n",
      a.model.c_str(), static_cast<long long>(cfg.n_layers), static_cast<long long>(cfg.vocab_size),
      c.summary().c_str(), static_cast<long long>(a.steps));
  std::printf("%8s %3s | %9s %9s %7s | %9s %9s %7s | %10s %10s %6s %10s | %9s\n", "context", "B",
              "NSA ms", "dense ms", "speedup", "NSA attn", "dense att", "speedup", "NSA KV MiB",
              "formula", "ratio", "dense MiB", "NSA tok/s");
  for (const int64_t S : a.contexts) {
    for (const int64_t B : a.batches) {
      const Measured n = measure(cfg, params, B, S, false, a);
      const Measured d = measure(cfg, params, B, S, true, a);
      // The paper's model: (S − l)/d + n_sel·l_sel + w tokens per group, layer and sequence.
      const double formula_tokens = static_cast<double>(S - c.l) / static_cast<double>(c.d) +
                                    static_cast<double>(c.n_sel * c.l_sel + c.w);
      const double formula =
          formula_tokens * static_cast<double>(B * cfg.n_layers * c.groups * (c.dk + c.dv) * 2);
      const double mib = 1024.0 * 1024.0;
      std::printf(
          "%8lld %3lld | %9.3f %9.3f %6.2fx | %9.3f %9.3f %6.2fx | %10.2f %10.2f %6.3f %10.1f | "
          "%9.0f\n",
          static_cast<long long>(S), static_cast<long long>(B), n.step_ms, d.step_ms,
          d.step_ms / n.step_ms, n.attn_ms, d.attn_ms, d.attn_ms / n.attn_ms, n.kv_bytes / mib,
          formula / mib, n.kv_bytes / formula, d.kv_bytes / mib,
          static_cast<double>(B) * 1e3 / n.step_ms);
      std::fflush(stdout);
      if (json) {
        *json << "{\"bench\":\"decode\",\"device\":\"cuda\",\"model\":\"" << a.model
              << "\",\"context\":" << S << ",\"batch\":" << B << ",\"nsa_step_ms\":" << n.step_ms
              << ",\"dense_step_ms\":" << d.step_ms << ",\"nsa_attention_ms\":" << n.attn_ms
              << ",\"dense_attention_ms\":" << d.attn_ms << ",\"nsa_kv_bytes\":" << n.kv_bytes
              << ",\"formula_kv_bytes\":" << formula << ",\"dense_kv_bytes\":" << d.kv_bytes
              << ",\"nsa_device_gib\":" << n.cache_gib << ",\"dense_device_gib\":" << d.cache_gib
              << "}\n";
      }
    }
  }
}

}  // namespace nsa::app
