// The GPU model's weights, bf16 copies and gradients (see model_params_cuda.h).
#include "model_params_cuda.h"

#include "cuda/common/convert.h"
#include "cuda/common/cuda_check.h"
#include "nsa/error.h"

namespace nsa::cuda {
namespace {

// Parameter offsets are multiples of this many elements, so every weight handed to cuBLASLt is
// 256-byte aligned as its default heuristics assume.
constexpr int64_t kSlotAlign = 128;
// A matrix reserves its rows in multiples of this many (zero rows after its own), so that a GEMM
// over matrices lying back to back (the attention projections' gradients, model_cuda.cpp) has a
// K or N that is a multiple of 8 – with the gates' 36 rows, m7c_125m's 1,572-row block made
// cuBLASLt fall back to sm80 kernels at a third of the speed of its Hopper ones.
constexpr int64_t kRowAlign = 8;

}  // namespace

ModelParamsCuda::ModelParamsCuda(const ModelConfig& cfg, cudaStream_t stream)
    : cfg_(cfg), stream_(stream) {
  const NsaConfig& a = cfg.attn;
  // Slots in named order (the checkpoint order), found by address in a host model.
  ModelParams<float> ref = init_model_params<float>(cfg);
  const auto named = ref.named(cfg);
  int64_t total = 0;
  for (const auto& [name, t] : named) {
    const bool matrix = t->shape.size() == 2;
    const int64_t rows = matrix ? (t->shape[0] + kRowAlign - 1) / kRowAlign * kRowAlign : 1;
    const int64_t cols = matrix ? t->shape[1] : t->numel();
    const int64_t reserved = (rows * cols + kSlotAlign - 1) / kSlotAlign * kSlotAlign;
    slots_.push_back(Slot{total, t->numel(), reserved, matrix, name, t->shape});
    total += reserved;
  }
  const auto slot_of = [&](const Tensor<float>& t) {
    for (size_t i = 0; i < named.size(); ++i) {
      if (named[i].second == &t) return static_cast<int>(i);
    }
    return -1;
  };
  tok_emb_slot_ = slot_of(ref.tok_emb);
  norm_slot_ = slot_of(ref.norm);
  output_slot_ = cfg.tie_embeddings ? tok_emb_slot_ : slot_of(ref.output);
  for (const LayerParams<float>& lp : ref.layers) {
    LayerSlots s{};
    s.attn_norm = slot_of(lp.attn_norm), s.wq = slot_of(lp.wq), s.wg = slot_of(lp.wg);
    s.bg = slot_of(lp.bg), s.wo = slot_of(lp.wo), s.ffn_norm = slot_of(lp.ffn_norm);
    s.w1 = slot_of(lp.w1), s.w2 = slot_of(lp.w2), s.w3 = slot_of(lp.w3);
    for (int c = 0; c < kNumBranches; ++c) {
      s.wk[c] = slot_of(lp.wk[a.kv_index(c)]);
      s.wv[c] = slot_of(lp.wv[a.kv_index(c)]);
    }
    for (int kv = 0; kv < 2; ++kv) {  // -1 for φ = avg: the tensors are not among the named
      const PhiMlpParams<float>& phi = kv == 0 ? lp.phi_k : lp.phi_v;
      const Tensor<float>* ts[kPhiMlpTensors] = {&phi.pos, &phi.w1, &phi.b1, &phi.w2, &phi.b2};
      for (int i = 0; i < kPhiMlpTensors; ++i) s.phi[kv][i] = slot_of(*ts[i]);
    }
    layer_slots_.push_back(s);
  }
  weights_.resize(total);
  weights_bf16_.resize(total);
  grads_.resize(total);
  weights_.zero(stream_);  // the alignment padding too
  grads_.zero(stream_);
  set(ref);
}

// host[i]: slot i's elements on the host. On the model's stream (it is non-blocking, so a plain
// cudaMemcpy would not be ordered with its kernels), then synchronised.
void ModelParamsCuda::copy_slots(const std::vector<float*>& host, float* dev, bool upload) {
  NSA_CHECK(host.size() == slots_.size(), "model parameters: ", host.size(), " tensors, expected ",
            slots_.size());
  for (size_t i = 0; i < host.size(); ++i) {
    const size_t bytes = static_cast<size_t>(slots_[i].numel) * sizeof(float);
    float* d = dev + slots_[i].offset;
    NSA_CUDA_CHECK(upload ? cudaMemcpyAsync(d, host[i], bytes, cudaMemcpyHostToDevice, stream_)
                          : cudaMemcpyAsync(host[i], d, bytes, cudaMemcpyDeviceToHost, stream_));
  }
  NSA_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void ModelParamsCuda::copy_named(ModelParams<float>& params, float* dev, bool upload) {
  std::vector<float*> host;
  for (const auto& [name, t] : params.named(cfg_)) {
    NSA_CHECK(host.size() < slots_.size() && t->numel() == slots_[host.size()].numel, "parameter ",
              name, " has ", t->numel(), " elements, which does not match the model");
    host.push_back(t->ptr());
  }
  copy_slots(host, dev, upload);
}

void ModelParamsCuda::set(ModelParams<float>& params) {
  copy_named(params, weights_.get(), true);
  launch_f32_to_bf16(weights_.get(), weights_bf16_.get(), weights_.size(), stream_);
}
void ModelParamsCuda::get(ModelParams<float>& params) {
  copy_named(params, weights_.get(), false);
}
void ModelParamsCuda::get_grads(ModelParams<float>& grads) {
  copy_named(grads, grads_.get(), false);
}

void ModelParamsCuda::upload_weights_flat(const std::vector<float>& flat) {
  NSA_CHECK(static_cast<int64_t>(flat.size()) == weights_.size(), "parameter buffer of ",
            flat.size(), " floats, expected ", weights_.size());
  NSA_CUDA_CHECK(cudaMemcpyAsync(weights_.get(), flat.data(), weights_.bytes(),
                                 cudaMemcpyHostToDevice, stream_));
  launch_f32_to_bf16(weights_.get(), weights_bf16_.get(), weights_.size(), stream_);
  NSA_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

int64_t ModelParamsCuda::layer_begin(int64_t li) const {
  NSA_CHECK(li >= 0 && li <= static_cast<int64_t>(layer_slots_.size()), "layer ", li,
            " is outside [0, ", layer_slots_.size(), "]");
  // Each layer's parameters start with its attention norm; the final norm follows the last.
  const int slot =
      li < static_cast<int64_t>(layer_slots_.size()) ? layer_slots_[li].attn_norm : norm_slot_;
  return slots_[slot].offset;
}

void ModelParamsCuda::refresh_bf16() {
  launch_f32_to_bf16(weights_.get(), weights_bf16_.get(), weights_.size(), stream_);
}

void ModelParamsCuda::download_weights_range(int64_t lo, int64_t hi, std::vector<float>& flat) {
  NSA_CHECK(0 <= lo && lo <= hi && hi <= weights_.size(), "weight range [", lo, ", ", hi,
            ") is outside the ", weights_.size(), " elements");
  flat.resize(static_cast<size_t>(weights_.size()));
  NSA_CUDA_CHECK(cudaMemcpyAsync(flat.data() + lo, weights_.get() + lo,
                                 static_cast<size_t>(hi - lo) * sizeof(float),
                                 cudaMemcpyDeviceToHost, stream_));
  NSA_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void ModelParamsCuda::zero_grads() {
  grads_.zero(stream_);
}

void ModelParamsCuda::download_grads_flat(std::vector<float>& host) {
  host.resize(static_cast<size_t>(grads_.size()));
  NSA_CUDA_CHECK(
      cudaMemcpyAsync(host.data(), grads_.get(), grads_.bytes(), cudaMemcpyDeviceToHost, stream_));
  NSA_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void ModelParamsCuda::upload_grads_flat(const std::vector<float>& host) {
  NSA_CHECK(static_cast<int64_t>(host.size()) == grads_.size(), "gradient buffer of ", host.size(),
            " floats, expected ", grads_.size());
  NSA_CUDA_CHECK(
      cudaMemcpyAsync(grads_.get(), host.data(), grads_.bytes(), cudaMemcpyHostToDevice, stream_));
  NSA_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

}  // namespace nsa::cuda
