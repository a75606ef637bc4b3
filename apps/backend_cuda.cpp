// The GPU backend (one CUDA device), registered when the build has the CUDA toolkit: this file is
// compiled only then, so no command tests a build flag (see backends.h).
#include <chrono>
#include <memory>

#include "backends.h"
#include "cuda/device.h"
#include "cuda/nsa/nsa_cuda_layer.h"
#include "decode/cuda/model_decoder_cuda.h"
#include "model/cuda/logit_rows_cuda.h"
#include "model/cuda/token_losses_cuda.h"
#include "train/cuda/train_model_cuda.h"

namespace nsa::app {
namespace {

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// Inputs are converted to bf16 on the device; outputs come back as fp32.
AttentionRun attention_cuda(const NsaConfig& cfg, const SeqLayout& layout,
                            const NsaTensors<float>& in, const Tensor<float>* d_o) {
  AttentionRun r;
  cuda::NsaCudaLayer layer(cfg, layout);
  layer.set_inputs(in);
  auto t0 = std::chrono::steady_clock::now();
  layer.forward();
  r.fwd = layer.download_forward();
  r.fwd_ms = ms_since(t0);
  if (d_o) {
    layer.set_output_grad(*d_o);
    t0 = std::chrono::steady_clock::now();
    layer.backward();
    r.grads = std::make_unique<NsaTensors<float>>(layer.download_grads());
    r.bwd_ms = ms_since(t0);
  }
  r.device_bytes = layer.device_bytes();
  return r;
}

// One GPU decoder with a batch of `batch` sequences; prompts prefilled in one batched forward.
Decoder decoder_cuda(const ModelConfig& cfg, const ModelParams<float>& params, int64_t batch,
                     int64_t max_len) {
  auto dec = std::make_shared<cuda::ModelDecoderCuda>(cfg, params, batch, max_len, false);
  Decoder d;
  d.prefill_kind = "batched forward, GPU";
  d.prefill = [dec](const std::vector<std::vector<int32_t>>& p) { return dec->prefill(p); };
  d.step = [dec](const std::vector<int32_t>& t) { return dec->step(t); };
  return d;
}

Backend gpu_backend() {
  Backend b;
  b.name = "cuda";
  b.device_count = cuda::device_count;
  b.describe = [] { return "cuda: " + cuda::device_description(cuda::select_local_device()); };
  b.train_model = cuda::make_train_model_cuda;
  b.logit_rows = cuda::make_logit_rows_cuda;
  b.token_losses = cuda::make_token_losses_cuda;
  b.decoder = decoder_cuda;
  b.attention = attention_cuda;
  b.time_attention = time_attention_cuda;
  b.bench_decode = bench_decode_cuda;
  b.bench_train = bench_train_cuda;
  return b;
}

const bool registered = register_backend(gpu_backend());

}  // namespace
}  // namespace nsa::app
