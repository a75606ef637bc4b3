// The NSA language model on one GPU (see model_cuda.h). The forward and backward follow
// model_cpu.cpp step by step; comments name the CPU counterpart where the order matters.
#include "model_cuda.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "common/convert.h"
#include "common/cuda_check.h"
#include "device.h"
#include "model_ops.h"
#include "nsa/nsa_cuda_layer.h"

namespace nsa::cuda {

// One layer's activations for its backward.
struct ModelCuda::Workspace {
  Workspace(const NsaConfig& attn, const SeqLayout& layout, int64_t T, int64_t D, int64_t F,
            std::shared_ptr<NsaBackwardBuffers> backward_buffers)
      : nsa(attn, layout, std::move(backward_buffers)),
        h1(T * D),
        h2(T * D),
        u1(T * F),
        u3(T * F),
        rstd1(T),
        rstd2(T),
        g_raw(T * 3 * attn.heads),
        x2(T * D) {}
  NsaCudaLayer nsa;
  DeviceBuffer<bf16> h1, h2, u1, u3;
  DeviceBuffer<float> rstd1, rstd2, g_raw, x2;
  size_t bytes() const {
    return nsa.device_bytes(true) + h1.bytes() + h2.bytes() + u1.bytes() + u3.bytes() +
           rstd1.bytes() + rstd2.bytes() + g_raw.bytes() + x2.bytes();
  }
};

namespace {

// Parameter offsets are multiples of this many elements, so every weight handed to cuBLASLt is
// 256-byte aligned as its default heuristics assume.
constexpr int64_t kSlotAlign = 128;

}  // namespace

const ModelConfig& checked_for_gpu(const ModelConfig& cfg) {
  NSA_CHECK(device_count() > 0, "--device cuda: no usable CUDA device (no GPU or no driver)");
  cfg.validate();
  NSA_CHECK(
      cfg.attn.phi == Phi::kAvg,
      "--device cuda: the GPU model supports phi = avg only (phi = mlp runs on --device cpu)");
  return cfg;
}

ModelCuda::ModelCuda(const ModelConfig& cfg, const SeqLayout& layout, bool recompute)
    : cfg_(checked_for_gpu(cfg)), recompute_(recompute) {
  const NsaConfig& a = cfg.attn;
  T_ = layout.total_tokens();
  F_ = cfg.ffn_hidden();
  const int64_t D = cfg.dim, T = T_, H = a.heads, Gk = a.groups, L = cfg.n_layers;
  NSA_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));

  // Parameter slots in named order (the checkpoint order), found by address in a host model.
  ModelParams<float> ref = init_model_params<float>(cfg);
  const auto named = ref.named(cfg);
  int64_t total = 0;
  for (const auto& [name, t] : named) {
    slots_.push_back(Slot{total, t->numel(), t->shape.size() == 2});
    total += (t->numel() + kSlotAlign - 1) / kSlotAlign * kSlotAlign;
  }
  const auto slot_of = [&](const Tensor<float>& t) {
    for (size_t i = 0; i < named.size(); ++i) {
      if (named[i].second == &t) return static_cast<int>(i);
    }
    return -1;
  };
  tok_emb_ = slot_of(ref.tok_emb);
  norm_ = slot_of(ref.norm);
  output_ = cfg.tie_embeddings ? tok_emb_ : slot_of(ref.output);
  for (const LayerParams<float>& lp : ref.layers) {
    LayerSlots s{};
    s.attn_norm = slot_of(lp.attn_norm), s.wq = slot_of(lp.wq), s.wg = slot_of(lp.wg);
    s.bg = slot_of(lp.bg), s.wo = slot_of(lp.wo), s.ffn_norm = slot_of(lp.ffn_norm);
    s.w1 = slot_of(lp.w1), s.w2 = slot_of(lp.w2), s.w3 = slot_of(lp.w3);
    for (int c = 0; c < kNumBranches; ++c) {
      s.wk[c] = slot_of(lp.wk[a.kv_index(c)]);
      s.wv[c] = slot_of(lp.wv[a.kv_index(c)]);
    }
    layer_slots_.push_back(s);
  }
  params_.resize(total);
  params_bf16_.resize(total);
  grads_.resize(total);
  adam_m_.resize(total);
  adam_v_.resize(total);
  params_.zero(stream_);  // the alignment padding too
  grads_.zero(stream_);
  adam_m_.zero(stream_);
  adam_v_.zero(stream_);
  shard_hi_ = total;
  set_params(ref);

  nsa_backward_ = std::make_shared<NsaBackwardBuffers>();  // one set for every layer
  for (int64_t i = 0; i < (recompute ? 1 : L); ++i) {
    workspaces_.push_back(std::make_unique<Workspace>(a, layout, T, D, F_, nsa_backward_));
  }
  for (int64_t i = 0; i <= L; ++i) xs_.emplace_back(T * D);
  tokens_.resize(T);
  targets_.resize(T);
  std::vector<int32_t> pos(static_cast<size_t>(T));
  for (int64_t n = 0; n < layout.num_seqs(); ++n) {
    for (int64_t t = 0; t < layout.length(n); ++t)
      pos[layout.start(n) + t] = static_cast<int32_t>(t);
  }
  positions_.upload(pos.data(), T);
  emb_order_.resize(T);
  emb_seg_token_.resize(T);
  emb_seg_start_.resize(T + 1);
  const int64_t width = std::max({H * a.dk, Gk * a.dk, 3 * H});
  proj_.resize(T * width);
  dx_.resize(T * D);
  dh_.resize(T * D);
  dm_.resize(T * F_);
  dz_.resize(T * 3 * H);
  norm_partial_.resize(
      std::max(T * D + column_sum_partial_floats(T, D), column_sum_partial_floats(T * H, 3)));
  sum_partial_.resize(1024);
  logits_.resize(T * cfg.vocab_size);
  row_loss_.resize(T);
  scalars_.resize(8);
  hf_.resize(T * D);
  rstdf_.resize(T);
  dlogits_.resize(T * cfg.vocab_size);
  dx_bf_.resize(T * D);
  du1_.resize(T * F_);
  m_.resize(T * F_);
  du3_.resize(T * F_);
  dz_bf_.resize(T * 3 * H);
  dq_bf_.resize(T * H * a.dk);
  dkv_bf_.resize(T * Gk * std::max(a.dk, a.dv));
  for (int64_t i = 0; i < 2 * L; ++i) {
    fwd_events_.emplace_back();
    bwd_events_.emplace_back();
    NSA_CUDA_CHECK(cudaEventCreate(&fwd_events_.back()));
    NSA_CUDA_CHECK(cudaEventCreate(&bwd_events_.back()));
  }
}

ModelCuda::~ModelCuda() {
  for (cudaEvent_t e : fwd_events_) cudaEventDestroy(e);
  for (cudaEvent_t e : bwd_events_) cudaEventDestroy(e);
  if (stream_) cudaStreamDestroy(stream_);
}

// host[i]: slot i's elements on the host. On the model's stream (it is non-blocking, so a plain
// cudaMemcpy would not be ordered with its kernels), then synchronised.
void ModelCuda::copy_slots(const std::vector<float*>& host, float* dev, bool upload) {
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

void ModelCuda::copy_named(ModelParams<float>& params, float* dev, bool upload) {
  std::vector<float*> host;
  for (const auto& [name, t] : params.named(cfg_)) {
    NSA_CHECK(host.size() < slots_.size() && t->numel() == slots_[host.size()].numel, "parameter ",
              name, " has ", t->numel(), " elements, which does not match the model");
    host.push_back(t->ptr());
  }
  copy_slots(host, dev, upload);
}

void ModelCuda::set_params(ModelParams<float>& params) {
  copy_named(params, params_.get(), true);
  launch_f32_to_bf16(params_.get(), params_bf16_.get(), params_.size(), stream_);
}
void ModelCuda::get_params(ModelParams<float>& params) {
  copy_named(params, params_.get(), false);
}
void ModelCuda::get_grads(ModelParams<float>& grads) {
  copy_named(grads, grads_.get(), false);
}

void ModelCuda::check_moments(const std::vector<Tensor<float>>& t) const {
  NSA_CHECK(t.size() == slots_.size(), "AdamW state: ", t.size(), " moments for ", slots_.size(),
            " parameters");
  for (size_t i = 0; i < slots_.size(); ++i) {
    NSA_CHECK(t[i].numel() == slots_[i].numel, "AdamW state: moment ", i, " has the wrong size");
  }
}

// The moments go through a host buffer laid out as the parameter buffer: one copy of this rank's
// slice each way.
void ModelCuda::set_adam_state(const std::vector<Tensor<float>>& m,
                               const std::vector<Tensor<float>>& v) {
  check_moments(m);
  check_moments(v);
  std::vector<float> flat(static_cast<size_t>(params_.size()), 0.0f);
  for (auto [host, dev] : {std::pair{&m, &adam_m_}, std::pair{&v, &adam_v_}}) {
    for (size_t i = 0; i < slots_.size(); ++i) {
      std::copy_n((*host)[i].ptr(), slots_[i].numel, flat.begin() + slots_[i].offset);
    }
    NSA_CUDA_CHECK(cudaMemcpyAsync(dev->get(), flat.data() + shard_lo_, dev->bytes(),
                                   cudaMemcpyHostToDevice, stream_));
    NSA_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
}

void ModelCuda::get_adam_state(std::vector<Tensor<float>>& m, std::vector<Tensor<float>>& v,
                               const GatherFlat& gather) {
  const bool sharded = shard_lo_ != 0 || shard_hi_ != params_.size();
  NSA_CHECK(!sharded || gather, "AdamW state of a sharded optimizer: the other ranks' slices ",
            "need a gather");
  check_moments(m);
  check_moments(v);
  for (auto [host, dev] : {std::pair{&m, &adam_m_}, std::pair{&v, &adam_v_}}) {
    std::vector<float> flat(static_cast<size_t>(params_.size()), 0.0f);
    NSA_CUDA_CHECK(cudaMemcpyAsync(flat.data() + shard_lo_, dev->get(), dev->bytes(),
                                   cudaMemcpyDeviceToHost, stream_));
    NSA_CUDA_CHECK(cudaStreamSynchronize(stream_));
    if (sharded) gather(flat);
    for (size_t i = 0; i < slots_.size(); ++i) {
      std::copy_n(flat.begin() + slots_[i].offset, slots_[i].numel, (*host)[i].ptr());
    }
  }
}

void ModelCuda::shard_optimizer(int64_t lo, int64_t hi) {
  NSA_CHECK(shard_lo_ <= lo && lo <= hi && hi <= shard_hi_, "optimizer shard [", lo, ", ", hi,
            ") is not inside the elements held [", shard_lo_, ", ", shard_hi_, ")");
  for (DeviceBuffer<float>* dev : {&adam_m_, &adam_v_}) {
    DeviceBuffer<float> slice(hi - lo);
    if (hi > lo) {
      NSA_CUDA_CHECK(cudaMemcpyAsync(slice.get(), dev->get() + (lo - shard_lo_), slice.bytes(),
                                     cudaMemcpyDeviceToDevice, stream_));
    }
    NSA_CUDA_CHECK(cudaStreamSynchronize(stream_));
    *dev = std::move(slice);
  }
  shard_lo_ = lo, shard_hi_ = hi;
}

void ModelCuda::download_param_slice(std::vector<float>& flat) {
  flat.resize(static_cast<size_t>(params_.size()));
  NSA_CUDA_CHECK(cudaMemcpyAsync(flat.data() + shard_lo_, params_.get() + shard_lo_,
                                 static_cast<size_t>(shard_hi_ - shard_lo_) * sizeof(float),
                                 cudaMemcpyDeviceToHost, stream_));
  NSA_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void ModelCuda::upload_params_flat(const std::vector<float>& flat) {
  NSA_CHECK(static_cast<int64_t>(flat.size()) == params_.size(), "parameter buffer of ",
            flat.size(), " floats, expected ", params_.size());
  NSA_CUDA_CHECK(cudaMemcpyAsync(params_.get(), flat.data(), params_.bytes(),
                                 cudaMemcpyHostToDevice, stream_));
  launch_f32_to_bf16(params_.get(), params_bf16_.get(), params_.size(), stream_);
  NSA_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void ModelCuda::zero_grads() {
  grads_.zero(stream_);
}

void ModelCuda::download_grads_flat(std::vector<float>& host) {
  host.resize(static_cast<size_t>(grads_.size()));
  NSA_CUDA_CHECK(
      cudaMemcpyAsync(host.data(), grads_.get(), grads_.bytes(), cudaMemcpyDeviceToHost, stream_));
  NSA_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void ModelCuda::upload_grads_flat(const std::vector<float>& host) {
  NSA_CHECK(static_cast<int64_t>(host.size()) == grads_.size(), "gradient buffer of ", host.size(),
            " floats, expected ", grads_.size());
  NSA_CUDA_CHECK(
      cudaMemcpyAsync(grads_.get(), host.data(), grads_.bytes(), cudaMemcpyHostToDevice, stream_));
  NSA_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

// model_cpu.cpp's layer forward: norm → q, k, v (RoPE), gates → NSA → wo + residual → norm → MLP
// + residual.
void ModelCuda::layer_forward(int64_t li, Workspace& ws, const float* x_in, float* x_out) {
  const NsaConfig& a = cfg_.attn;
  const LayerSlots& s = layer_slots_[li];
  const int64_t T = T_, D = cfg_.dim, H = a.heads, Gk = a.groups;
  cudaStream_t st = stream_;
  launch_rmsnorm_forward(x_in, P(s.attn_norm), static_cast<float>(cfg_.norm_eps), ws.h1.get(),
                         ws.rstd1.get(), T, D, st);
  gemm_.linear_forward(ws.h1.get(), Pb(s.wq), f32(proj_.get()), T, D, H * a.dk, 0.0f, st);
  launch_rope_to_bf16(proj_.get(), ws.nsa.q_in(), positions_.get(), T, H, a.dk, cfg_.rope_base,
                      false, st);
  for (int c = 0; c < kNumBranches; ++c) {
    if (a.kv_index(c) != c) continue;
    gemm_.linear_forward(ws.h1.get(), Pb(s.wk[c]), f32(proj_.get()), T, D, Gk * a.dk, 0.0f, st);
    launch_rope_to_bf16(proj_.get(), ws.nsa.k_in(c), positions_.get(), T, Gk, a.dk, cfg_.rope_base,
                        false, st);
    gemm_.linear_forward(ws.h1.get(), Pb(s.wv[c]), b16(ws.nsa.v_in(c)), T, D, Gk * a.dv, 0.0f, st);
  }
  gemm_.linear_forward(ws.h1.get(), Pb(s.wg), f32(proj_.get()), T, D, 3 * H, 0.0f, st);
  bool enabled[3];
  bf16* gates[3];
  for (int c = 0; c < kNumBranches; ++c) {
    enabled[c] = cfg_.branch_enabled(c);
    gates[c] = ws.nsa.gate_in(c);
  }
  launch_gate_forward(proj_.get(), P(s.bg), a.gate == GateActivation::kSoftmax, enabled,
                      ws.g_raw.get(), gates, T, H, st);
  ws.nsa.forward(st);
  NSA_CUDA_CHECK(cudaMemcpyAsync(ws.x2.get(), x_in, ws.x2.bytes(), cudaMemcpyDeviceToDevice, st));
  gemm_.linear_forward(ws.nsa.o_out(), Pb(s.wo), f32(ws.x2.get()), T, H * a.dv, D, 1.0f, st);
  launch_rmsnorm_forward(ws.x2.get(), P(s.ffn_norm), static_cast<float>(cfg_.norm_eps), ws.h2.get(),
                         ws.rstd2.get(), T, D, st);
  const bool swiglu = cfg_.mlp == "swiglu";
  gemm_.linear_forward(ws.h2.get(), Pb(s.w1), b16(ws.u1.get()), T, D, F_, 0.0f, st);
  if (swiglu) gemm_.linear_forward(ws.h2.get(), Pb(s.w3), b16(ws.u3.get()), T, D, F_, 0.0f, st);
  // m = silu(u1)·u3 is not kept: the backward recomputes it from u1, u3.
  launch_swiglu_forward(ws.u1.get(), swiglu ? ws.u3.get() : nullptr, m_.get(), T * F_, st);
  NSA_CUDA_CHECK(cudaMemcpyAsync(x_out, ws.x2.get(), ws.x2.bytes(), cudaMemcpyDeviceToDevice, st));
  gemm_.linear_forward(m_.get(), Pb(s.w2), f32(x_out), T, F_, D, 1.0f, st);
}

// dx: in, the gradient of the layer's output; out, of its input.
void ModelCuda::layer_backward(int64_t li, Workspace& ws, const float* x_in, float* dx) {
  const NsaConfig& a = cfg_.attn;
  const LayerSlots& s = layer_slots_[li];
  const int64_t T = T_, D = cfg_.dim, H = a.heads, Gk = a.groups;
  cudaStream_t st = stream_;
  const bool swiglu = cfg_.mlp == "swiglu";
  // MLP.
  launch_f32_to_bf16(dx, dx_bf_.get(), T * D, st);
  gemm_.linear_input_grad(dx_bf_.get(), Pb(s.w2), f32(dm_.get()), T, F_, D, 0.0f, st);
  launch_swiglu_forward(ws.u1.get(), swiglu ? ws.u3.get() : nullptr, m_.get(), T * F_, st);
  gemm_.linear_weight_grad(dx_bf_.get(), m_.get(), G(s.w2), T, F_, D, st);
  launch_swiglu_backward(ws.u1.get(), swiglu ? ws.u3.get() : nullptr, dm_.get(), du1_.get(),
                         du3_.get(), T * F_, st);
  gemm_.linear_input_grad(du1_.get(), Pb(s.w1), f32(dh_.get()), T, D, F_, 0.0f, st);
  gemm_.linear_weight_grad(du1_.get(), ws.h2.get(), G(s.w1), T, D, F_, st);
  if (swiglu) {
    gemm_.linear_input_grad(du3_.get(), Pb(s.w3), f32(dh_.get()), T, D, F_, 1.0f, st);
    gemm_.linear_weight_grad(du3_.get(), ws.h2.get(), G(s.w3), T, D, F_, st);
  }
  launch_rmsnorm_backward(ws.x2.get(), P(s.ffn_norm), ws.rstd2.get(), dh_.get(), dx, true,
                          G(s.ffn_norm), norm_partial_.get(), T, D, st);
  // Attention: wo, NSA, gates, projections.
  launch_f32_to_bf16(dx, dx_bf_.get(), T * D, st);
  gemm_.linear_input_grad(dx_bf_.get(), Pb(s.wo), b16(ws.nsa.d_o_in()), T, H * a.dv, D, 0.0f, st);
  gemm_.linear_weight_grad(dx_bf_.get(), ws.nsa.o_out(), G(s.wo), T, H * a.dv, D, st);
  ws.nsa.backward(st);
  bool enabled[3];
  const float* d_gate[3];
  for (int c = 0; c < kNumBranches; ++c) {
    enabled[c] = cfg_.branch_enabled(c);
    d_gate[c] = ws.nsa.d_gate_out(c);
  }
  launch_gate_backward(ws.g_raw.get(), d_gate, a.gate == GateActivation::kSoftmax, enabled,
                       dz_.get(), T, H, st);
  launch_column_sum_accumulate(dz_.get(), T, 3 * H, norm_partial_.get(), G(s.bg), st);
  launch_f32_to_bf16(dz_.get(), dz_bf_.get(), T * 3 * H, st);
  gemm_.linear_input_grad(dz_bf_.get(), Pb(s.wg), f32(dh_.get()), T, D, 3 * H, 0.0f, st);
  gemm_.linear_weight_grad(dz_bf_.get(), ws.h1.get(), G(s.wg), T, D, 3 * H, st);
  launch_rope_to_bf16(ws.nsa.d_q_out(), dq_bf_.get(), positions_.get(), T, H, a.dk, cfg_.rope_base,
                      true, st);
  gemm_.linear_input_grad(dq_bf_.get(), Pb(s.wq), f32(dh_.get()), T, D, H * a.dk, 1.0f, st);
  gemm_.linear_weight_grad(dq_bf_.get(), ws.h1.get(), G(s.wq), T, D, H * a.dk, st);
  for (int c = 0; c < kNumBranches; ++c) {
    if (a.kv_index(c) != c) continue;
    launch_rope_to_bf16(ws.nsa.d_k_out(c), dkv_bf_.get(), positions_.get(), T, Gk, a.dk,
                        cfg_.rope_base, true, st);
    gemm_.linear_input_grad(dkv_bf_.get(), Pb(s.wk[c]), f32(dh_.get()), T, D, Gk * a.dk, 1.0f, st);
    gemm_.linear_weight_grad(dkv_bf_.get(), ws.h1.get(), G(s.wk[c]), T, D, Gk * a.dk, st);
    launch_f32_to_bf16(ws.nsa.d_v_out(c), dkv_bf_.get(), T * Gk * a.dv, st);
    gemm_.linear_input_grad(dkv_bf_.get(), Pb(s.wv[c]), f32(dh_.get()), T, D, Gk * a.dv, 1.0f, st);
    gemm_.linear_weight_grad(dkv_bf_.get(), ws.h1.get(), G(s.wv[c]), T, D, Gk * a.dv, st);
  }
  launch_rmsnorm_backward(x_in, P(s.attn_norm), ws.rstd1.get(), dh_.get(), dx, true, G(s.attn_norm),
                          norm_partial_.get(), T, D, st);
}

double ModelCuda::forward_backward(const std::vector<int32_t>& tokens,
                                   const std::vector<int32_t>& targets, bool backward,
                                   ModelStats* stats) {
  const int64_t T = T_, D = cfg_.dim, V = cfg_.vocab_size, L = cfg_.n_layers;
  NSA_CHECK(static_cast<int64_t>(tokens.size()) == T && static_cast<int64_t>(targets.size()) == T,
            "model: ", tokens.size(), " tokens and ", targets.size(), " targets for a layout of ",
            T);
  for (int64_t t = 0; t < T; ++t) {
    NSA_CHECK(tokens[t] >= 0 && tokens[t] < V, "token id ", tokens[t], " at position ", t,
              " is outside the vocabulary [0, ", V, ")");
    NSA_CHECK(targets[t] >= 0 && targets[t] < V, "target id ", targets[t], " at position ", t,
              " is outside the vocabulary [0, ", V, ")");
  }
  cudaStream_t st = stream_;
  NSA_CUDA_CHECK(cudaMemcpyAsync(tokens_.get(), tokens.data(), T * sizeof(int32_t),
                                 cudaMemcpyHostToDevice, st));
  NSA_CUDA_CHECK(cudaMemcpyAsync(targets_.get(), targets.data(), T * sizeof(int32_t),
                                 cudaMemcpyHostToDevice, st));
  scalars_.zero(st);
  launch_embedding_forward(tokens_.get(), P(tok_emb_), xs_[0].get(), T, D, st);
  for (int64_t li = 0; li < L; ++li) {
    Workspace& ws = *workspaces_[recompute_ ? 0 : li];
    NSA_CUDA_CHECK(cudaEventRecord(fwd_events_[2 * li], st));
    layer_forward(li, ws, xs_[li].get(), xs_[li + 1].get());
    NSA_CUDA_CHECK(cudaEventRecord(fwd_events_[2 * li + 1], st));
    launch_column_sum_accumulate(ws.g_raw.get(), T * cfg_.attn.heads, 3, norm_partial_.get(),
                                 scalars_.get() + 1, st);
  }
  launch_rmsnorm_forward(xs_[L].get(), P(norm_), static_cast<float>(cfg_.norm_eps), hf_.get(),
                         rstdf_.get(), T, D, st);
  gemm_.linear_forward(hf_.get(), Pb(output_), f32(logits_.get()), T, D, V, 0.0f, st);
  launch_cross_entropy(logits_.get(), targets_.get(), T, V, 1.0f / static_cast<float>(T),
                       row_loss_.get(), backward ? dlogits_.get() : nullptr, st);
  launch_sum(row_loss_.get(), T, false, 1.0f / static_cast<float>(T), sum_partial_.get(),
             scalars_.get(), st);
  if (backward) {
    gemm_.linear_input_grad(dlogits_.get(), Pb(output_), f32(dh_.get()), T, D, V, 0.0f, st);
    gemm_.linear_weight_grad(dlogits_.get(), hf_.get(), G(output_), T, D, V, st);
    launch_rmsnorm_backward(xs_[L].get(), P(norm_), rstdf_.get(), dh_.get(), dx_.get(), false,
                            G(norm_), norm_partial_.get(), T, D, st);
    for (int64_t li = L; li-- > 0;) {
      Workspace& ws = *workspaces_[recompute_ ? 0 : li];
      // With recompute the workspace still holds the last layer's forward; refill it for the
      // others (the recomputed output equals xs_[li + 1] bit for bit).
      NSA_CUDA_CHECK(cudaEventRecord(bwd_events_[2 * li], st));
      if (recompute_ && li != L - 1) layer_forward(li, ws, xs_[li].get(), xs_[li + 1].get());
      layer_backward(li, ws, xs_[li].get(), dx_.get());
      NSA_CUDA_CHECK(cudaEventRecord(bwd_events_[2 * li + 1], st));
    }
    // Rows grouped by token (a counting sort), so the embedding gradient sums in a fixed order.
    std::vector<int32_t> count(static_cast<size_t>(V) + 1, 0), order(static_cast<size_t>(T));
    for (int64_t t = 0; t < T; ++t) ++count[tokens[t] + 1];
    for (int64_t v = 0; v < V; ++v) count[v + 1] += count[v];
    std::vector<int32_t> next(count.begin(), count.end() - 1), seg_token, seg_start;
    for (int64_t t = 0; t < T; ++t) order[next[tokens[t]]++] = static_cast<int32_t>(t);
    for (int64_t v = 0; v < V; ++v) {
      if (count[v + 1] == count[v]) continue;
      seg_token.push_back(static_cast<int32_t>(v));
      seg_start.push_back(count[v]);
    }
    seg_start.push_back(static_cast<int32_t>(T));
    NSA_CUDA_CHECK(cudaMemcpyAsync(emb_order_.get(), order.data(), T * sizeof(int32_t),
                                   cudaMemcpyHostToDevice, st));
    NSA_CUDA_CHECK(cudaMemcpyAsync(emb_seg_token_.get(), seg_token.data(),
                                   seg_token.size() * sizeof(int32_t), cudaMemcpyHostToDevice, st));
    NSA_CUDA_CHECK(cudaMemcpyAsync(emb_seg_start_.get(), seg_start.data(),
                                   seg_start.size() * sizeof(int32_t), cudaMemcpyHostToDevice, st));
    launch_embedding_backward(emb_order_.get(), emb_seg_token_.get(), emb_seg_start_.get(),
                              static_cast<int64_t>(seg_token.size()), dx_.get(), G(tok_emb_), D,
                              st);
  }
  float host[4];
  NSA_CUDA_CHECK(cudaMemcpyAsync(host, scalars_.get(), sizeof(host), cudaMemcpyDeviceToHost, st));
  NSA_CUDA_CHECK(cudaStreamSynchronize(st));
  if (stats) {
    stats->layer_forward_ms.assign(static_cast<size_t>(L), 0.0);
    stats->layer_backward_ms.assign(static_cast<size_t>(L), 0.0);
    stats->layer_bytes.assign(static_cast<size_t>(L), 0);
    for (int64_t li = 0; li < L; ++li) {
      float ms = 0;
      NSA_CUDA_CHECK(cudaEventElapsedTime(&ms, fwd_events_[2 * li], fwd_events_[2 * li + 1]));
      stats->layer_forward_ms[li] = ms;
      if (backward) {
        NSA_CUDA_CHECK(cudaEventElapsedTime(&ms, bwd_events_[2 * li], bwd_events_[2 * li + 1]));
        stats->layer_backward_ms[li] = ms;
      }
      // What a layer keeps for its backward: its input and its workspace (shared with recompute).
      stats->layer_bytes[li] = static_cast<int64_t>(
          xs_[li].bytes() + (recompute_ && li > 0 ? 0 : workspaces_[recompute_ ? 0 : li]->bytes()));
    }
    for (int c = 0; c < kNumBranches; ++c) {
      stats->gate_mean[c] =
          cfg_.branch_enabled(c) ? host[1 + c] / static_cast<double>(T * cfg_.attn.heads * L) : 0.0;
    }
  }
  return host[0];
}

void ModelCuda::download_logit_rows(const std::vector<int64_t>& rows, std::vector<float>& out) {
  const int64_t V = cfg_.vocab_size;
  out.resize(rows.size() * static_cast<size_t>(V));
  for (size_t i = 0; i < rows.size(); ++i) {
    NSA_CHECK(rows[i] >= 0 && rows[i] < T_, "logit row ", rows[i], " is outside [0, ", T_, ")");
    NSA_CUDA_CHECK(cudaMemcpyAsync(out.data() + i * V, logits_.get() + rows[i] * V,
                                   V * sizeof(float), cudaMemcpyDeviceToHost, stream_));
  }
  NSA_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

double ModelCuda::optimizer_step(const AdamWConfig& adam, int64_t step, double grad_scale) {
  cudaStream_t st = stream_;
  launch_sum(grads_.get(), grads_.size(), true, 1.0f, sum_partial_.get(), scalars_.get() + 4, st);
  float sq = 0;
  NSA_CUDA_CHECK(
      cudaMemcpyAsync(&sq, scalars_.get() + 4, sizeof(float), cudaMemcpyDeviceToHost, st));
  NSA_CUDA_CHECK(cudaStreamSynchronize(st));
  const double norm = std::sqrt(static_cast<double>(sq)) * grad_scale;
  const double clip = adam.clip > 0 && norm > adam.clip ? adam.clip / norm : 1.0;
  const double t = static_cast<double>(step + 1);
  AdamWScalars s{};
  s.lr = static_cast<float>(lr_at(adam, step));
  s.beta1 = static_cast<float>(adam.beta1);
  s.beta2 = static_cast<float>(adam.beta2);
  s.bc1 = static_cast<float>(1.0 - std::pow(adam.beta1, t));
  s.bc2 = static_cast<float>(1.0 - std::pow(adam.beta2, t));
  s.eps = static_cast<float>(adam.eps);
  s.g_scale = static_cast<float>(grad_scale * clip);
  for (const Slot& slot : slots_) {  // the part of each tensor inside this rank's slice
    const int64_t a = std::max(slot.offset, shard_lo_);
    const int64_t b = std::min(slot.offset + slot.numel, shard_hi_);
    if (a >= b) continue;
    s.weight_decay = slot.decay ? static_cast<float>(adam.weight_decay) : 0.0f;
    launch_adamw(params_.get() + a, params_bf16_.get() + a, grads_.get() + a,
                 adam_m_.get() + (a - shard_lo_), adam_v_.get() + (a - shard_lo_), b - a, s, st);
  }
  return norm;
}

size_t ModelCuda::device_bytes() const {
  size_t total =
      params_.bytes() + params_bf16_.bytes() + grads_.bytes() + adam_m_.bytes() + adam_v_.bytes() +
      tokens_.bytes() + targets_.bytes() + positions_.bytes() + emb_order_.bytes() +
      emb_seg_token_.bytes() + emb_seg_start_.bytes() + proj_.bytes() + dx_.bytes() + dh_.bytes() +
      dm_.bytes() + dz_.bytes() + norm_partial_.bytes() + sum_partial_.bytes() + logits_.bytes() +
      row_loss_.bytes() + scalars_.bytes() + hf_.bytes() + dlogits_.bytes() + dx_bf_.bytes() +
      m_.bytes() + du1_.bytes() + du3_.bytes() + dz_bf_.bytes() + dq_bf_.bytes() + dkv_bf_.bytes() +
      rstdf_.bytes() + (32u << 20);  // + the GEMM workspace
  for (const auto& ws : workspaces_) total += ws->bytes();
  total += nsa_backward_->bytes();
  for (const auto& x : xs_) total += x.bytes();
  return total;
}

}  // namespace nsa::cuda
