// GPU timing of NSA attention (see bench_attention_cuda.h). Events around each pass on one stream;
// medians of `reps` runs after one warm-up.
#include "bench_attention_cuda.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <vector>

#include "cuda/common/cuda_check.h"
#include "cuda/nsa/nsa_cuda_layer.h"

namespace nsa::app {
namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
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
  cudaEvent_t e0, e1, e2;
  NSA_CUDA_CHECK(cudaEventCreate(&e0));
  NSA_CUDA_CHECK(cudaEventCreate(&e1));
  NSA_CUDA_CHECK(cudaEventCreate(&e2));
  layer.forward(stream);  // warm-up: module load, first-touch of every buffer
  layer.backward(stream);
  std::vector<double> fwd, bwd;
  for (int r = 0; r < reps; ++r) {
    NSA_CUDA_CHECK(cudaEventRecord(e0, stream));
    layer.forward(stream);
    NSA_CUDA_CHECK(cudaEventRecord(e1, stream));
    layer.backward(stream);
    NSA_CUDA_CHECK(cudaEventRecord(e2, stream));
    NSA_CUDA_CHECK(cudaEventSynchronize(e2));
    float a = 0, b = 0;
    NSA_CUDA_CHECK(cudaEventElapsedTime(&a, e0, e1));
    NSA_CUDA_CHECK(cudaEventElapsedTime(&b, e1, e2));
    fwd.push_back(a), bwd.push_back(b);
  }
  CudaAttentionTiming out;
  out.fwd_ms = median(fwd);
  out.bwd_ms = median(bwd);
  out.device_bytes = static_cast<int64_t>(layer.device_bytes());
  cudaEventDestroy(e0), cudaEventDestroy(e1), cudaEventDestroy(e2);
  cudaStreamDestroy(stream);
  return out;
}

}  // namespace nsa::app
