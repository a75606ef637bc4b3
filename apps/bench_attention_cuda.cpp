// GPU timing of NSA attention (see bench_attention_cuda.h). Events around each pass on one stream;
// medians of `reps` runs after one warm-up, first launched call by call (eager), then each pass
// replayed from a CUDA graph captured once (launch costs on the host gone: what a captured
// training step sees).
#include "bench_attention_cuda.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <vector>

#include "cuda/common/cuda_check.h"
#include "cuda/nsa/nsa_cuda_layer.h"

namespace nsa::app {
namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Medians of forward and backward over `reps` runs; each run starts on an idle GPU (the host waits
// for the previous one), so host-side launch time shows in the eager numbers.
// `host_ms` (if given): the median host time of issuing both passes.
void time_passes(const std::function<void()>& fwd_pass, const std::function<void()>& bwd_pass,
                 cudaStream_t stream, int reps, double* fwd_ms, double* bwd_ms,
                 double* host_ms = nullptr) {
  cudaEvent_t e0, e1, e2;
  NSA_CUDA_CHECK(cudaEventCreate(&e0));
  NSA_CUDA_CHECK(cudaEventCreate(&e1));
  NSA_CUDA_CHECK(cudaEventCreate(&e2));
  std::vector<double> fwd, bwd, host;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    NSA_CUDA_CHECK(cudaEventRecord(e0, stream));
    fwd_pass();
    NSA_CUDA_CHECK(cudaEventRecord(e1, stream));
    bwd_pass();
    NSA_CUDA_CHECK(cudaEventRecord(e2, stream));
    host.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    NSA_CUDA_CHECK(cudaEventSynchronize(e2));
    float a = 0, b = 0;
    NSA_CUDA_CHECK(cudaEventElapsedTime(&a, e0, e1));
    NSA_CUDA_CHECK(cudaEventElapsedTime(&b, e1, e2));
    fwd.push_back(a), bwd.push_back(b);
  }
  *fwd_ms = median(fwd);
  *bwd_ms = median(bwd);
  if (host_ms) *host_ms = median(host);
  cudaEventDestroy(e0), cudaEventDestroy(e1), cudaEventDestroy(e2);
}

cudaGraphExec_t capture(const std::function<void()>& pass, cudaStream_t stream) {
  cudaGraph_t graph;
  NSA_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  pass();
  NSA_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec;
  // The side stream's higher priority (StreamFork) is kept per node; without this flag every node
  // would run at the launching stream's priority.
  NSA_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, cudaGraphInstantiateFlagUseNodePriority));
  NSA_CUDA_CHECK(cudaGraphDestroy(graph));
  return exec;
}

}  // namespace

CudaAttentionTiming time_attention_cuda(const NsaConfig& cfg, int64_t batch, int64_t seq_len,
                                        int reps) {
  const SeqLayout layout = SeqLayout::batch(batch, seq_len);
  cuda::NsaCudaLayer layer(cfg, layout);
  layer.set_inputs(random_nsa_inputs<float>(cfg, batch * seq_len, 1234));
  NsaConfig do_cfg = cfg;
  do_cfg.dk = cfg.dv;
  layer.set_output_grad(random_nsa_inputs<float>(do_cfg, batch * seq_len, 99).q);
  cudaStream_t stream;
  NSA_CUDA_CHECK(cudaStreamCreate(&stream));
  const auto fwd = [&] { layer.forward(stream); };
  const auto bwd = [&] { layer.backward(stream); };
  fwd();  // warm-up: module load, first-touch of every buffer
  bwd();
  CudaAttentionTiming out;
  time_passes(fwd, bwd, stream, reps, &out.fwd_ms, &out.bwd_ms, &out.host_ms);
  cudaGraphExec_t g_fwd = capture(fwd, stream), g_bwd = capture(bwd, stream);
  const auto replay = [&](cudaGraphExec_t g) { NSA_CUDA_CHECK(cudaGraphLaunch(g, stream)); };
  replay(g_fwd);  // warm-up: the graphs' first upload
  replay(g_bwd);
  time_passes([&] { replay(g_fwd); }, [&] { replay(g_bwd); }, stream, reps, &out.graph_fwd_ms,
              &out.graph_bwd_ms);
  cudaGraphExecDestroy(g_fwd), cudaGraphExecDestroy(g_bwd);
  out.device_bytes = static_cast<int64_t>(layer.device_bytes());
  cudaStreamDestroy(stream);
  return out;
}

}  // namespace nsa::app
