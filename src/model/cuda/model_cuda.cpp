// The NSA language model on one GPU (see model_cuda.h). The forward and backward follow
// model_cpu.cpp step by step; comments name the CPU counterpart where the order matters.
#include "model_cuda.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <string>
#include <utility>

#include "cuda/common/convert.h"
#include "cuda/common/cuda_check.h"
#include "cuda/device.h"
#include "cuda/nsa/nsa_cuda_layer.h"
#include "model/cuda/model_ops.h"

namespace nsa::cuda {

// One layer's activations for its backward. The attention's state (nsa), the norms' 1/rms and
// the raw gate logits are always the layer's own. The norms' outputs h1, h2 (bf16 [T, D]), the
// MLP's up-projections u1, u3 (bf16 [T, F]) and the attention's residual sum x2 (fp32 [T, D]) are
// too – or, with Recompute::kOps, they point into buffers every layer shares (h1 and h2 one
// buffer, x2 the projections' fp32 scratch), which the backward refills.
struct ModelCuda::Workspace {
  Workspace(const NsaConfig& attn, const SeqLayout& layout, int64_t T, int64_t D, int64_t F,
            std::shared_ptr<NsaBackwardBuffers> backward_buffers, bool own_activations)
      : nsa(attn, layout, std::move(backward_buffers)),
        rstd1(T),
        rstd2(T),
        g_raw(T * 3 * attn.heads) {
    if (!own_activations) return;  // the model points h1 … x2 at its shared buffers
    own_h1.resize(T * D), own_h2.resize(T * D), own_u1.resize(T * F), own_u3.resize(T * F);
    own_x2.resize(T * D);
    h1 = own_h1.get(), h2 = own_h2.get(), u1 = own_u1.get(), u3 = own_u3.get();
    x2 = own_x2.get();
  }
  NsaCudaLayer nsa;
  DeviceBuffer<float> rstd1, rstd2, g_raw;
  bf16 *h1 = nullptr, *h2 = nullptr, *u1 = nullptr, *u3 = nullptr;
  float* x2 = nullptr;
  // The bytes this layer holds alone (not the shared buffers).
  size_t bytes() const {
    return nsa.device_bytes(true) + rstd1.bytes() + rstd2.bytes() + g_raw.bytes() + own_h1.bytes() +
           own_h2.bytes() + own_u1.bytes() + own_u3.bytes() + own_x2.bytes();
  }

 private:
  DeviceBuffer<bf16> own_h1, own_h2, own_u1, own_u3;
  DeviceBuffer<float> own_x2;
};

namespace {

cudaStream_t new_stream() {
  cudaStream_t s = nullptr;
  NSA_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  return s;
}

}  // namespace

const ModelConfig& checked_for_gpu(const ModelConfig& cfg) {
  NSA_CHECK(device_count() > 0, "--device cuda: no usable CUDA device (no GPU or no driver)");
  cfg.validate();
  return cfg;
}

ModelCuda::ModelCuda(const ModelConfig& cfg, const SeqLayout& layout, Recompute recompute)
    : cfg_(checked_for_gpu(cfg)),
      recompute_(recompute),
      n_tokens_(layout.total_tokens()),
      ffn_dim_(cfg.ffn_hidden()),
      stream_(new_stream()),
      params_(cfg_, stream_) {
  const NsaConfig& a = cfg.attn;
  const int64_t D = cfg.dim, T = n_tokens_, H = a.heads, Gk = a.groups, L = cfg.n_layers;
  nsa_backward_ = std::make_shared<NsaBackwardBuffers>();  // one set for every layer
  // attention = full: the window widened to the longest sequence (model_config.h); the branch
  // masks of the gates (branch_enabled) do the rest, as on the CPU.
  const NsaConfig layer_attn = cfg.layer_attention(layout.max_length());
  const bool ops = recompute == Recompute::kOps;
  const int64_t width = std::max({H * a.dk, Gk * a.dk, 3 * H, ops ? D : 0});
  proj_out_.resize(T * width);
  if (ops) {
    shared_h_.resize(T * D), shared_u1_.resize(T * ffn_dim_), shared_u3_.resize(T * ffn_dim_);
    shared_q_.resize(T * H * a.dk);
  }
  for (int64_t i = 0; i < (recompute == Recompute::kLayers ? 1 : L); ++i) {
    workspaces_.push_back(
        std::make_unique<Workspace>(layer_attn, layout, T, D, ffn_dim_, nsa_backward_, !ops));
    if (!ops) continue;
    Workspace& ws = *workspaces_.back();
    ws.h1 = ws.h2 = shared_h_.get();  // h1 is read before h2 is written, in both passes
    ws.u1 = shared_u1_.get(), ws.u3 = shared_u3_.get();
    ws.x2 = proj_out_.get();  // the projections' scratch is free from the attention on
    ws.nsa.use_query_buffer(shared_q_.get());
  }
  for (int64_t i = 0; i <= L; ++i) layer_inputs_.emplace_back(T * D);
  tokens_.resize(T);
  targets_.resize(T);
  std::vector<int32_t> pos(static_cast<size_t>(T));
  for (int64_t n = 0; n < layout.num_seqs(); ++n) {
    for (int64_t t = 0; t < layout.length(n); ++t)
      pos[layout.start(n) + t] = static_cast<int32_t>(t);
  }
  positions_.upload(pos.data(), T);
  rope_table_.resize(layout.max_length() * (a.dk / 2));
  launch_rope_table(layout.max_length(), a.dk, cfg.rope_base, rope_table_.get(), stream_);
  emb_order_.resize(T);
  emb_seg_token_.resize(T);
  emb_seg_start_.resize(T + 1);
  residual_grad_.resize(T * D);
  norm_out_grad_.resize(T * D);
  mlp_act_grad_bf_.resize(T * ffn_dim_);
  gate_logit_grad_.resize(T * 3 * H);
  norm_partial_.resize(
      std::max({rmsnorm_backward_partial_floats(T, D), column_sum_partial_floats(T, 3 * H),
                column_sum_partial_floats(T * H, 3)}));
  sum_partial_.resize(1024);
  // The LM head's row chunk: about 256 MiB of fp32 logits and their bf16 gradient, a multiple of
  // 128 rows (the whole batch for small vocabularies).
  logit_chunk_rows_ =
      std::max<int64_t>(128, (int64_t{256} << 20) / (6 * cfg.vocab_size) / 128 * 128);
  row_loss_.resize(T);
  step_scalars_.resize(kNumScalars);
  final_norm_out_.resize(T * D);
  final_norm_rstd_.resize(T);
  residual_grad_bf_.resize(T * D);
  up1_grad_bf_.resize(T * ffn_dim_);
  mlp_act_bf_.resize(T * ffn_dim_);
  up3_grad_bf_.resize(T * ffn_dim_);
  {
    using P = ProjPart;
    proj_parts_.push_back({P::kQuery, 0, H * a.dk, 0});
    for (int c = 0; c < kNumBranches; ++c) {
      if (a.kv_index(c) != c) continue;
      proj_parts_.push_back({P::kKey, c, Gk * a.dk, 0});
      proj_parts_.push_back({P::kValue, c, Gk * a.dv, 0});
    }
    proj_parts_.push_back({P::kGate, 0, 3 * H, 0});
    // One GEMM needs every layer's parts back to back in the parameter buffer, each slot's
    // reserved rows (its own, then zero ones: ModelParamsCuda::Slot) whole rows of D. Its block
    // of dy then has one column per reserved row; the columns of the zero rows stay zero.
    const auto& slots = params_.slots();
    bool one_gemm = true;
    for (int64_t li = 0; li < L; ++li) {
      for (size_t i = 0; i < proj_parts_.size(); ++i) {
        const auto& slot = slots[proj_parts_[i].slot(params_.layer(li))];
        one_gemm = one_gemm && slot.reserved % D == 0;
        if (i == 0) continue;
        const auto& prev = slots[proj_parts_[i - 1].slot(params_.layer(li))];
        one_gemm = one_gemm && slot.offset == prev.offset + prev.reserved;
      }
    }
    int64_t col = 0;
    for (ProjPart& part : proj_parts_) {
      if (!one_gemm) col = (col + 127) / 128 * 128;  // each part's GEMM: a 256-byte-aligned dy
      part.col = col;
      col += one_gemm ? slots[part.slot(params_.layer(0))].reserved / D : part.width;
    }
    proj_one_gemm_ = one_gemm;
    proj_gemm_width_ = col;
    proj_ld_ = (col + 7) / 8 * 8;
    proj_grad_bf_.resize(T * proj_ld_);
    proj_grad_bf_.zero(stream_);  // the columns no part writes
  }
  sel_hist_.resize(kSelDistanceBuckets);
  nonfinite_.resize(1);
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

template <typename T>
void ModelCuda::check_finite(const T* x, const Shape& shape, const std::string& what) {
  if (!checking_) return;
  launch_find_nonfinite(x, shape_numel(shape), nonfinite_.get(), stream_);
  NonFiniteHit hit{};
  NSA_CUDA_CHECK(
      cudaMemcpyAsync(&hit, nonfinite_.get(), sizeof(hit), cudaMemcpyDeviceToHost, stream_));
  NSA_CUDA_CHECK(cudaStreamSynchronize(stream_));
  NSA_CHECK(hit.index == ~0ull, "anomaly: non-finite value ", hit.value, " in ", what, " (element ",
            hit.index, " of shape ", shape_str(shape), ")");
}

// model_cpu.cpp's layer forward: norm → q, k, v (RoPE), gates → NSA → wo + residual → norm → MLP
// + residual. The anomaly checks are the CPU's, in its order.
void ModelCuda::layer_forward(int64_t li, Workspace& ws, const float* x_in, float* x_out,
                              bool recomputing) {
  const NsaConfig& a = cfg_.attn;
  const ModelParamsCuda::LayerSlots& s = params_.layer(li);
  const int64_t T = n_tokens_, D = cfg_.dim, H = a.heads, Gk = a.groups;
  const bool check = !recomputing;
  const std::string layer = "layer " + std::to_string(li) + " ";
  cudaStream_t st = stream_;
  attention_norm_forward(li, ws, x_in, check);
  query_forward(li, ws);
  for (int c = 0; c < kNumBranches; ++c) {
    if (a.kv_index(c) != c) continue;
    mark(StepPhase::kGemmForward);
    gemm_.linear_forward(ws.h1, params_.weight_bf16(s.wk[c]), f32(proj_out_.get()), T, D, Gk * a.dk,
                         0.0f, st);
    mark(StepPhase::kElementwise);
    launch_rope_to_bf16(proj_out_.get(), ws.nsa.k_in(c), Gk * a.dk, positions_.get(),
                        rope_table_.get(), T, Gk, a.dk, false, st);
    mark(StepPhase::kGemmForward);
    gemm_.linear_forward(ws.h1, params_.weight_bf16(s.wv[c]), b16(ws.nsa.v_in(c)), T, D, Gk * a.dv,
                         0.0f, st);
  }
  gemm_.linear_forward(ws.h1, params_.weight_bf16(s.wg), f32(proj_out_.get()), T, D, 3 * H, 0.0f,
                       st);
  bool enabled[3];
  bf16* gates[3];
  for (int c = 0; c < kNumBranches; ++c) {
    enabled[c] = cfg_.branch_enabled(c);
    gates[c] = ws.nsa.gate_in(c);
  }
  mark(StepPhase::kElementwise);
  launch_gate_forward(proj_out_.get(), params_.weight(s.bg), a.gate == GateActivation::kSoftmax,
                      enabled, ws.g_raw.get(), gates, T, H, st);
  if (a.phi == Phi::kMlp) {  // the compression MLPs read their weights in the flat buffer
    const float* phi[2][kPhiMlpTensors];
    for (int kv = 0; kv < 2; ++kv) {
      for (int i = 0; i < kPhiMlpTensors; ++i) phi[kv][i] = params_.weight(s.phi[kv][i]);
    }
    ws.nsa.set_mlp_params(phi[0], phi[1]);
  }
  mark(StepPhase::kAttentionForward);
  ws.nsa.forward(st);
  if (check) {
    check_finite(ws.nsa.q_in(), {T, H, a.dk}, layer + "queries");
    check_finite(ws.nsa.o_out(), {T, H, a.dv}, layer + "NSA attention output");
  }
  mlp_inputs_forward(li, ws, x_in, check);
  const bool swiglu = cfg_.mlp == "swiglu";
  // m = silu(u1)·u3 is not kept: the backward recomputes it from u1, u3.
  mark(StepPhase::kElementwise);
  launch_swiglu_forward(ws.u1, swiglu ? ws.u3 : nullptr, mlp_act_bf_.get(), T * ffn_dim_, st);
  mark(StepPhase::kGemmForward);  // x_out = x2 + m·W2ᵀ
  gemm_.linear_forward_residual(mlp_act_bf_.get(), params_.weight_bf16(s.w2), ws.x2, x_out, T,
                                ffn_dim_, D, st);
  if (check) check_finite(x_out, {T, D}, layer + "MLP output");  // x_out = x2 + w2·m, as above
}

// h1 = attention_norm(x_in) and its 1/rms.
void ModelCuda::attention_norm_forward(int64_t li, Workspace& ws, const float* x_in, bool check) {
  const ModelParamsCuda::LayerSlots& s = params_.layer(li);
  const int64_t T = n_tokens_, D = cfg_.dim;
  mark(StepPhase::kElementwise);
  launch_rmsnorm_forward(x_in, params_.weight(s.attn_norm), static_cast<float>(cfg_.norm_eps),
                         ws.h1, ws.rstd1.get(), T, D, stream_);
  if (check) check_finite(ws.h1, {T, D}, "layer " + std::to_string(li) + " attention_norm output");
}

// The queries q = RoPE(h1·Wqᵀ), through the fp32 projection scratch.
void ModelCuda::query_forward(int64_t li, Workspace& ws) {
  const NsaConfig& a = cfg_.attn;
  const int64_t T = n_tokens_, D = cfg_.dim, H = a.heads;
  mark(StepPhase::kGemmForward);
  gemm_.linear_forward(ws.h1, params_.weight_bf16(params_.layer(li).wq), f32(proj_out_.get()), T, D,
                       H * a.dk, 0.0f, stream_);
  mark(StepPhase::kElementwise);
  launch_rope_to_bf16(proj_out_.get(), ws.nsa.q_in(), H * a.dk, positions_.get(), rope_table_.get(),
                      T, H, a.dk, false, stream_);
}

// From the attention's output on: x2 = x_in + o·Woᵀ, h2 = ffn_norm(x2) and its 1/rms, and the
// MLP's up-projections u1 = h2·W1ᵀ, u3 = h2·W3ᵀ.
void ModelCuda::mlp_inputs_forward(int64_t li, Workspace& ws, const float* x_in, bool check) {
  const NsaConfig& a = cfg_.attn;
  const ModelParamsCuda::LayerSlots& s = params_.layer(li);
  const int64_t T = n_tokens_, D = cfg_.dim, H = a.heads;
  cudaStream_t st = stream_;
  mark(StepPhase::kGemmForward);  // x2 = x + o·Woᵀ: the residual add in the GEMM's epilogue
  gemm_.linear_forward_residual(ws.nsa.o_out(), params_.weight_bf16(s.wo), x_in, ws.x2, T, H * a.dv,
                                D, st);
  // x2 = x + wo·o: with x finite (checked before), x2 is finite exactly where wo·o is.
  if (check) {
    check_finite(ws.x2, {T, D},
                 "layer " + std::to_string(li) + " attention projection (wo) output");
  }
  mark(StepPhase::kElementwise);
  launch_rmsnorm_forward(ws.x2, params_.weight(s.ffn_norm), static_cast<float>(cfg_.norm_eps),
                         ws.h2, ws.rstd2.get(), T, D, st);
  mark(StepPhase::kGemmForward);
  gemm_.linear_forward(ws.h2, params_.weight_bf16(s.w1), b16(ws.u1), T, D, ffn_dim_, 0.0f, st);
  if (cfg_.mlp == "swiglu")
    gemm_.linear_forward(ws.h2, params_.weight_bf16(s.w3), b16(ws.u3), T, D, ffn_dim_, 0.0f, st);
}

// dx: in, the gradient of the layer's output; out, of its input. residual_grad_bf_ holds dx in
// bf16 on entry and on return (the norms' backwards write both).
void ModelCuda::layer_backward(int64_t li, Workspace& ws, const float* x_in, float* dx) {
  const NsaConfig& a = cfg_.attn;
  const ModelParamsCuda::LayerSlots& s = params_.layer(li);
  const int64_t T = n_tokens_, D = cfg_.dim, H = a.heads, Gk = a.groups;
  cudaStream_t st = stream_;
  const bool swiglu = cfg_.mlp == "swiglu";
  const bool ops = recompute_ == Recompute::kOps;
  // Recompute::kOps: the shared buffers hold the last layer's forward; refill them for the others
  // (the same kernels on the same inputs: the forward's bits).
  if (ops && li != cfg_.n_layers - 1) mlp_inputs_forward(li, ws, x_in, false);
  // MLP.
  mark(StepPhase::kGemmBackward);
  gemm_.linear_input_grad(residual_grad_bf_.get(), params_.weight_bf16(s.w2),
                          b16(mlp_act_grad_bf_.get()), T, ffn_dim_, D, 0.0f, st);
  // The activation's backward also recomputes m = silu(u1)·u3 (the forward's bits) for W2's
  // gradient: one pass over u1 and u3 instead of two.
  mark(StepPhase::kElementwise);
  launch_swiglu_backward(ws.u1, swiglu ? ws.u3 : nullptr, mlp_act_grad_bf_.get(),
                         up1_grad_bf_.get(), up3_grad_bf_.get(), mlp_act_bf_.get(), T * ffn_dim_,
                         st);
  mark(StepPhase::kGemmBackward);
  gemm_.linear_weight_grad(residual_grad_bf_.get(), mlp_act_bf_.get(), params_.grad(s.w2), T,
                           ffn_dim_, D, st);
  gemm_.linear_input_grad(up1_grad_bf_.get(), params_.weight_bf16(s.w1), f32(norm_out_grad_.get()),
                          T, D, ffn_dim_, 0.0f, st);
  gemm_.linear_weight_grad(up1_grad_bf_.get(), ws.h2, params_.grad(s.w1), T, D, ffn_dim_, st);
  if (swiglu) {
    gemm_.linear_input_grad(up3_grad_bf_.get(), params_.weight_bf16(s.w3),
                            f32(norm_out_grad_.get()), T, D, ffn_dim_, 1.0f, st);
    gemm_.linear_weight_grad(up3_grad_bf_.get(), ws.h2, params_.grad(s.w3), T, D, ffn_dim_, st);
  }
  mark(StepPhase::kElementwise);
  launch_rmsnorm_backward(ws.x2, params_.weight(s.ffn_norm), ws.rstd2.get(), norm_out_grad_.get(),
                          dx, true, residual_grad_bf_.get(), params_.grad(s.ffn_norm),
                          norm_partial_.get(), T, D, st);
  // Attention: wo, NSA, gates, projections.
  mark(StepPhase::kGemmBackward);
  gemm_.linear_input_grad(residual_grad_bf_.get(), params_.weight_bf16(s.wo), b16(ws.nsa.d_o_in()),
                          T, H * a.dv, D, 0.0f, st);
  gemm_.linear_weight_grad(residual_grad_bf_.get(), ws.nsa.o_out(), params_.grad(s.wo), T, H * a.dv,
                           D, st);
  if (ops) {  // h1 (its buffer held h2) and, but for the last layer's, the queries
    attention_norm_forward(li, ws, x_in, false);
    if (li != cfg_.n_layers - 1) query_forward(li, ws);
  }
  mark(StepPhase::kAttentionBackward);
  ws.nsa.backward(st);
  mark(StepPhase::kElementwise);
  if (a.phi == Phi::kMlp) {  // the layer's φ gradients (overwritten each backward) into the sums
    for (int kv = 0; kv < 2; ++kv) {
      for (int i = 0; i < kPhiMlpTensors; ++i) {
        const int slot = s.phi[kv][i];
        launch_add_into(ws.nsa.mlp_grad(kv, i), params_.grad(slot), params_.slots()[slot].numel,
                        st);
      }
    }
  }
  bool enabled[3];
  const float* d_gate[3];
  for (int c = 0; c < kNumBranches; ++c) {
    enabled[c] = cfg_.branch_enabled(c);
    d_gate[c] = ws.nsa.d_gate_out(c);
  }
  launch_gate_backward(ws.g_raw.get(), d_gate, a.gate == GateActivation::kSoftmax, enabled,
                       gate_logit_grad_.get(), T, H, st);
  launch_column_sum_accumulate(gate_logit_grad_.get(), T, 3 * H, norm_partial_.get(),
                               params_.grad(s.bg), st);
  // The projections' output gradients into their columns of proj_grad_bf_, then their GEMMs.
  bf16* pg = proj_grad_bf_.get();
  const int64_t ld = proj_ld_;
  for (const ProjPart& part : proj_parts_) {
    switch (part.kind) {
      case ProjPart::kQuery:
        launch_rope_to_bf16(ws.nsa.d_q_out(), pg + part.col, ld, positions_.get(),
                            rope_table_.get(), T, H, a.dk, true, st);
        break;
      case ProjPart::kKey:
        launch_rope_to_bf16(ws.nsa.d_k_out(part.branch), pg + part.col, ld, positions_.get(),
                            rope_table_.get(), T, Gk, a.dk, true, st);
        break;
      case ProjPart::kValue:
        launch_f32_to_bf16_rows(ws.nsa.d_v_out(part.branch), T, part.width, pg + part.col, ld, st);
        break;
      case ProjPart::kGate:
        launch_f32_to_bf16_rows(gate_logit_grad_.get(), T, part.width, pg + part.col, ld, st);
        break;
    }
  }
  mark(StepPhase::kGemmBackward);
  const auto project_grads = [&](int slot, int64_t col, int64_t width, float beta) {
    gemm_.linear_input_grad(pg + col, params_.weight_bf16(slot), f32(norm_out_grad_.get()), T, D,
                            width, beta, st, ld);
    gemm_.linear_weight_grad(pg + col, ws.h1, params_.grad(slot), T, D, width, st, ld);
  };
  if (proj_one_gemm_) {  // the first part's slot starts the block of all of them
    project_grads(proj_parts_.front().slot(s), 0, proj_gemm_width_, 0.0f);
  } else {
    for (size_t i = 0; i < proj_parts_.size(); ++i) {
      const ProjPart& part = proj_parts_[i];
      project_grads(part.slot(s), part.col, part.width, i == 0 ? 0.0f : 1.0f);
    }
  }
  mark(StepPhase::kElementwise);
  launch_rmsnorm_backward(x_in, params_.weight(s.attn_norm), ws.rstd1.get(), norm_out_grad_.get(),
                          dx, true, li > 0 ? residual_grad_bf_.get() : nullptr,
                          params_.grad(s.attn_norm), norm_partial_.get(), T, D, st);
}

double ModelCuda::forward_backward(const std::vector<int32_t>& tokens,
                                   const std::vector<int32_t>& targets, bool backward,
                                   ModelStats* stats) {
  const int64_t T = n_tokens_, D = cfg_.dim, V = cfg_.vocab_size, L = cfg_.n_layers;
  const NsaConfig& a = cfg_.attn;
  NSA_CHECK(static_cast<int64_t>(tokens.size()) == T && static_cast<int64_t>(targets.size()) == T,
            "model: ", tokens.size(), " tokens and ", targets.size(), " targets for a layout of ",
            T);
  for (int64_t t = 0; t < T; ++t) {
    NSA_CHECK(tokens[t] >= 0 && tokens[t] < V, "token id ", tokens[t], " at position ", t,
              " is outside the vocabulary [0, ", V, ")");
    NSA_CHECK(targets[t] >= 0 && targets[t] < V, "target id ", targets[t], " at position ", t,
              " is outside the vocabulary [0, ", V, ")");
  }
  if (stats) {  // as model_loss_cpu: the request flags stay, the results start over
    ModelStats fresh;
    fresh.check_finite = stats->check_finite;
    fresh.keep_outputs = stats->keep_outputs;
    fresh.keep_token_losses = stats->keep_token_losses;
    *stats = std::move(fresh);
  }
  checking_ = stats && stats->check_finite;
  const bool keep = stats && stats->keep_outputs;
  cudaStream_t st = stream_;
  mark(StepPhase::kOther);
  NSA_CUDA_CHECK(cudaMemcpyAsync(tokens_.get(), tokens.data(), T * sizeof(int32_t),
                                 cudaMemcpyHostToDevice, st));
  NSA_CUDA_CHECK(cudaMemcpyAsync(targets_.get(), targets.data(), T * sizeof(int32_t),
                                 cudaMemcpyHostToDevice, st));
  step_scalars_.zero(st);
  if (stats) sel_hist_.zero(st);
  mark(StepPhase::kElementwise);
  launch_embedding_forward(tokens_.get(), params_.weight(params_.tok_emb_slot()),
                           layer_inputs_[0].get(), T, D, st);
  check_finite(layer_inputs_[0].get(), {T, D}, "the token embedding output");
  for (int64_t li = 0; li < L; ++li) {
    Workspace& ws = workspace(li);
    NSA_CUDA_CHECK(cudaEventRecord(fwd_events_[2 * li], st));
    layer_forward(li, ws, layer_inputs_[li].get(), layer_inputs_[li + 1].get(), false);
    NSA_CUDA_CHECK(cudaEventRecord(fwd_events_[2 * li + 1], st));
    mark(StepPhase::kElementwise);
    launch_column_sum_accumulate(ws.g_raw.get(), T * a.heads, 3, norm_partial_.get(),
                                 step_scalars_.get() + kGateSum, st);
    if (stats) {
      launch_sel_distance_hist(ws.nsa.sel_idx_out(), positions_.get(), T, a.groups, a.n_sel,
                               a.l_sel, sel_hist_.get(), st);
    }
    if (keep) {
      Tensor<int32_t> sel({T, a.groups, a.n_sel});
      NSA_CUDA_CHECK(cudaMemcpyAsync(sel.ptr(), ws.nsa.sel_idx_out(), sel.numel() * sizeof(int32_t),
                                     cudaMemcpyDeviceToHost, st));
      const int64_t H = a.heads;
      std::vector<bf16> g(static_cast<size_t>(kNumBranches * T * H));
      for (int c = 0; c < kNumBranches; ++c) {
        NSA_CUDA_CHECK(cudaMemcpyAsync(g.data() + c * T * H, ws.nsa.gate_in(c),
                                       T * H * sizeof(bf16), cudaMemcpyDeviceToHost, st));
      }
      NSA_CUDA_CHECK(cudaStreamSynchronize(st));
      stats->sel_idx.push_back(std::move(sel));
      Tensor<float> gates({T, H, kNumBranches});  // the gates NSA took: [T, H] bf16 per branch
      for (int64_t i = 0; i < T * H; ++i) {
        for (int c = 0; c < kNumBranches; ++c)
          gates[i * kNumBranches + c] = __bfloat162float(g[c * T * H + i]);
      }
      stats->gates.push_back(std::move(gates));
    }
  }
  launch_rmsnorm_forward(layer_inputs_[L].get(), params_.weight(params_.norm_slot()),
                         static_cast<float>(cfg_.norm_eps), final_norm_out_.get(),
                         final_norm_rstd_.get(), T, D, st);
  // LM head and loss in row chunks, each chunk's logits (and their gradient) gone before the
  // next: only the row losses outlive them – unless the caller reads the logits (the whole
  // batch's then, in one chunk).
  mark(StepPhase::kLmHeadLoss);
  const bool whole = keep || checking_ || keep_logits_;
  const int64_t rows = whole ? T : std::min(T, logit_chunk_rows_);
  if (logits_.size() < rows * V) logits_.resize(rows * V);  // grows once, to what is asked
  if (backward && logits_grad_bf_.size() < rows * V) logits_grad_bf_.resize(rows * V);
  logits_whole_ = whole;
  const bf16* w_out = params_.weight_bf16(params_.output_slot());
  for (int64_t r0 = 0; r0 < T; r0 += rows) {
    const int64_t n = std::min(rows, T - r0);
    gemm_.linear_forward(final_norm_out_.get() + r0 * D, w_out, f32(logits_.get()), n, D, V, 0.0f,
                         st);
    if (whole) check_finite(logits_.get(), {T, V}, "the logits");
    launch_cross_entropy(logits_.get(), targets_.get() + r0, n, V, 1.0f / static_cast<float>(T),
                         row_loss_.get() + r0, backward ? logits_grad_bf_.get() : nullptr, st);
    if (!backward) continue;
    gemm_.linear_input_grad(logits_grad_bf_.get(), w_out, f32(norm_out_grad_.get() + r0 * D), n, D,
                            V, 0.0f, st);
    gemm_.linear_weight_grad(logits_grad_bf_.get(), final_norm_out_.get() + r0 * D,
                             params_.grad(params_.output_slot()), n, D, V, st);
  }
  launch_sum(row_loss_.get(), T, false, 1.0f / static_cast<float>(T), sum_partial_.get(),
             step_scalars_.get() + kLoss, st);
  if (backward) {
    mark(StepPhase::kElementwise);
    launch_rmsnorm_backward(layer_inputs_[L].get(), params_.weight(params_.norm_slot()),
                            final_norm_rstd_.get(), norm_out_grad_.get(), residual_grad_.get(),
                            false, residual_grad_bf_.get(), params_.grad(params_.norm_slot()),
                            norm_partial_.get(), T, D, st);
    if (grads_ready_) grads_ready_(params_.layer_begin(L), params_.flat_size());
    for (int64_t li = L; li-- > 0;) {
      Workspace& ws = workspace(li);
      // With recompute = layers the workspace still holds the last layer's forward; refill it for
      // the others (the recomputed output equals layer_inputs_[li + 1] bit for bit).
      NSA_CUDA_CHECK(cudaEventRecord(bwd_events_[2 * li], st));
      if (recompute_ == Recompute::kLayers && li != L - 1)
        layer_forward(li, ws, layer_inputs_[li].get(), layer_inputs_[li + 1].get(), true);
      layer_backward(li, ws, layer_inputs_[li].get(), residual_grad_.get());
      NSA_CUDA_CHECK(cudaEventRecord(bwd_events_[2 * li + 1], st));
      if (grads_ready_) grads_ready_(params_.layer_begin(li), params_.layer_begin(li + 1));
      check_finite(residual_grad_.get(), {T, D},
                   "the gradient of layer " + std::to_string(li) + "'s input");
    }
    // Rows grouped by token (a counting sort), so the embedding gradient sums in a fixed order.
    mark(StepPhase::kOther);
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
    mark(StepPhase::kElementwise);
    launch_embedding_backward(emb_order_.get(), emb_seg_token_.get(), emb_seg_start_.get(),
                              static_cast<int64_t>(seg_token.size()), residual_grad_.get(),
                              params_.grad(params_.tok_emb_slot()), D, st);
    if (grads_ready_) grads_ready_(0, params_.layer_begin(0));
    if (checking_) {  // every parameter gradient, in named order: the first bad element's slot
      launch_find_nonfinite(params_.grads_flat(), params_.flat_size(), nonfinite_.get(), st);
      NonFiniteHit hit{};
      NSA_CUDA_CHECK(
          cudaMemcpyAsync(&hit, nonfinite_.get(), sizeof(hit), cudaMemcpyDeviceToHost, st));
      NSA_CUDA_CHECK(cudaStreamSynchronize(st));
      for (const ModelParamsCuda::Slot& slot : params_.slots()) {
        const int64_t i = static_cast<int64_t>(hit.index) - slot.offset;
        NSA_CHECK(hit.index == ~0ull || i < 0 || i >= slot.numel, "anomaly: non-finite value ",
                  hit.value, " in the gradient of ", slot.name, " (element ", i, " of shape ",
                  shape_str(slot.shape), ")");
      }
      NSA_CHECK(hit.index == ~0ull, "anomaly: non-finite value ", hit.value,
                " in the gradient buffer's alignment padding (element ", hit.index, ")");
    }
  }
  mark(StepPhase::kOther);
  float host[4];
  unsigned long long hist[kSelDistanceBuckets];
  NSA_CUDA_CHECK(
      cudaMemcpyAsync(host, step_scalars_.get(), sizeof(host), cudaMemcpyDeviceToHost, st));
  if (stats) {
    NSA_CUDA_CHECK(
        cudaMemcpyAsync(hist, sel_hist_.get(), sizeof(hist), cudaMemcpyDeviceToHost, st));
  }
  if (keep) {
    stats->logits = Tensor<float>({T, V});
    NSA_CUDA_CHECK(cudaMemcpyAsync(stats->logits.ptr(), logits_.get(), T * V * sizeof(float),
                                   cudaMemcpyDeviceToHost, st));
  }
  NSA_CUDA_CHECK(cudaStreamSynchronize(st));
  if (stats && stats->keep_token_losses) {
    std::vector<float> losses;
    download_token_losses(losses);
    stats->token_loss.assign(losses.begin(), losses.end());
  }
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
      // What a layer keeps for its backward: its input and its workspace; buffers that layers
      // share (recompute) count at layer 0.
      const bool shared = recompute_ == Recompute::kLayers;
      stats->layer_bytes[li] = static_cast<int64_t>(
          layer_inputs_[li].bytes() + (shared && li > 0 ? 0 : workspace(li).bytes()) +
          (li == 0 ? shared_h_.bytes() + shared_u1_.bytes() + shared_u3_.bytes() + shared_q_.bytes()
                   : 0));
    }
    for (int c = 0; c < kNumBranches; ++c) {
      stats->gate_mean[c] =
          cfg_.branch_enabled(c) ? host[kGateSum + c] / static_cast<double>(T * a.heads * L) : 0.0;
    }
    static_assert(std::size(ModelStats{}.sel_distance_hist) == kSelDistanceBuckets);
    for (int k = 0; k < kSelDistanceBuckets; ++k) {
      stats->sel_distance_hist[k] = static_cast<int64_t>(hist[k]);
    }
  }
  return host[kLoss];
}

void ModelCuda::download_logit_rows(const std::vector<int64_t>& rows, std::vector<float>& out) {
  const int64_t V = cfg_.vocab_size;
  NSA_CHECK(logits_whole_,
            "download_logit_rows: the last pass computed its logits in row chunks; "
            "call keep_logits(true) before it");
  out.resize(rows.size() * static_cast<size_t>(V));
  for (size_t i = 0; i < rows.size(); ++i) {
    NSA_CHECK(rows[i] >= 0 && rows[i] < n_tokens_, "logit row ", rows[i], " is outside [0, ",
              n_tokens_, ")");
    NSA_CUDA_CHECK(cudaMemcpyAsync(out.data() + i * V, logits_.get() + rows[i] * V,
                                   V * sizeof(float), cudaMemcpyDeviceToHost, stream_));
  }
  NSA_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void ModelCuda::download_token_losses(std::vector<float>& out) {
  out.resize(static_cast<size_t>(n_tokens_));
  NSA_CUDA_CHECK(cudaMemcpyAsync(out.data(), row_loss_.get(), n_tokens_ * sizeof(float),
                                 cudaMemcpyDeviceToHost, stream_));
  NSA_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

float ModelCuda::grad_sum_of_squares() {
  cudaStream_t st = stream_;
  launch_sum(params_.grads_flat(), params_.flat_size(), true, 1.0f, sum_partial_.get(),
             step_scalars_.get() + kGradSquares, st);
  float sq = 0;
  NSA_CUDA_CHECK(cudaMemcpyAsync(&sq, step_scalars_.get() + kGradSquares, sizeof(float),
                                 cudaMemcpyDeviceToHost, st));
  NSA_CUDA_CHECK(cudaStreamSynchronize(st));
  return sq;
}

size_t ModelCuda::device_bytes() const {
  size_t total = params_.device_bytes() + tokens_.bytes() + targets_.bytes() + positions_.bytes() +
                 rope_table_.bytes() + emb_order_.bytes() + emb_seg_token_.bytes() +
                 emb_seg_start_.bytes() + proj_out_.bytes() + residual_grad_.bytes() +
                 norm_out_grad_.bytes() + mlp_act_grad_bf_.bytes() + gate_logit_grad_.bytes() +
                 norm_partial_.bytes() + sum_partial_.bytes() + logits_.bytes() +
                 row_loss_.bytes() + step_scalars_.bytes() + final_norm_out_.bytes() +
                 logits_grad_bf_.bytes() + residual_grad_bf_.bytes() + mlp_act_bf_.bytes() +
                 up1_grad_bf_.bytes() + up3_grad_bf_.bytes() + proj_grad_bf_.bytes() +
                 final_norm_rstd_.bytes() + shared_h_.bytes() + shared_u1_.bytes() +
                 shared_u3_.bytes() + shared_q_.bytes() + (32u << 20);  // + the GEMM workspace
  for (const auto& ws : workspaces_) total += ws->bytes();
  total += nsa_backward_->bytes();
  for (const auto& x : layer_inputs_) total += x.bytes();
  return total;
}

}  // namespace nsa::cuda
