// Batched prefill of the GPU decoder (ModelDecoderCuda::prefill, model_decoder_cuda.h;
// docs/inference.md, "Prefill"). Per group of prompts (decode/prefill_plan.h), packed back to back:
// the decode step's own ops with T = the group's tokens in place of B – embedding, per layer
// RMSNorm, the fused input GEMM, decode_inputs (rotary at each token's position in its prompt,
// gates), the training forward of the NSA attention over the packed layout (NsaCudaLayer: one
// forward, cu_seqlens), wo, the MLP – and after each layer's attention its K/V go straight into
// that layer's decode caches (NsaDecodeCuda::prefill). The LM head runs on each prompt's last row
// only. The forward's buffers live for one group and are freed after it.
#include <algorithm>

#include "cuda/nsa/nsa_cuda_layer.h"
#include "cuda/nsa/nsa_decode.h"
#include "model_decoder_cuda.h"
#include "nsa/error.h"

namespace nsa::cuda {

std::vector<float> ModelDecoderCuda::prefill(const std::vector<std::vector<int32_t>>& prompts,
                                             int64_t token_budget) {
  NSA_CHECK(!dense_,
            "prefill: dense decoding (the benchmark's baseline) has no prefill; decode its "
            "prompts token by token");
  NSA_CHECK(static_cast<int64_t>(prompts.size()) == B_, "prefill: ", prompts.size(),
            " prompts for a batch of ", B_);
  NSA_CHECK(position() == 0, "prefill needs a fresh decoder (a sequence is at position ",
            position(), "; reset() first)");
  const PrefillPlan plan = plan_prefill(prompts, cfg_.vocab_size, max_len_, token_budget);
  const int64_t V = cfg_.vocab_size;
  std::vector<float> logits(static_cast<size_t>(B_ * V));
  for (const PrefillGroup& group : plan.groups) prefill_group(group, prompts, logits);
  for (int64_t b = 0; b < B_; ++b) {
    const int64_t src = plan.source[b];
    if (src == b) continue;
    for (auto& layer : attn_) {
      layer->copy_sequence(src, b, static_cast<int64_t>(prompts[b].size()), stream_);
    }
    std::copy_n(logits.begin() + src * V, V, logits.begin() + b * V);
  }
  for (int64_t b = 0; b < B_; ++b) lens_[b] = static_cast<int64_t>(prompts[b].size());
  upload_positions();  // synchronises: the caches are complete on return
  return logits;
}

void ModelDecoderCuda::prefill_group(const PrefillGroup& group,
                                     const std::vector<std::vector<int32_t>>& prompts,
                                     std::vector<float>& logits) {
  const NsaConfig& a = cfg_.attn;
  const int64_t T = group.layout.total_tokens(), n = group.layout.num_seqs(), D = cfg_.dim;
  const int64_t H = a.heads, V = cfg_.vocab_size, F = F_, W = inputs_.width;
  const float eps = static_cast<float>(cfg_.norm_eps);
  const bool swiglu = cfg_.mlp == "swiglu";
  cudaStream_t st = stream_;
  std::vector<int32_t> tokens, positions;
  pack_prefill_group(group, prompts, tokens, positions);
  const std::vector<int32_t> seqs(group.seqs.begin(), group.seqs.end());
  DeviceBuffer<int32_t> tok, pos, seq;
  DeviceBuffer<int64_t> cu;
  tok.upload(tokens.data(), T);
  pos.upload(positions.data(), T);
  seq.upload(seqs.data(), n);
  cu.upload(group.layout.cu_seqlens.data(), n + 1);
  // attention = full: the window covers the group's longest prompt (ModelConfig::layer_attention).
  NsaCudaLayer attn(cfg_.layer_attention(group.layout.max_length()), group.layout);
  DeviceBuffer<float> x(T * D), proj(T * W), rstd(T);
  DeviceBuffer<bf16> h(T * D), u1(T * F), u3(swiglu ? T * F : 0), m(T * F);
  // decode_inputs writes straight into the attention's inputs: q [T, H, dk], k/v [T, G, d],
  // gates [T, H] – the layouts of one decode step with T rows.
  DecodeInputs in = inputs_;
  in.q = attn.q_in();
  const bf16* k[kNumBranches];
  const bf16* v[kNumBranches];
  for (int c = 0; c < kNumBranches; ++c) {
    in.k[c] = inputs_.k[c] ? attn.k_in(c) : nullptr;
    in.v[c] = inputs_.v[c] ? attn.v_in(c) : nullptr;
    in.gate[c] = attn.gate_in(c);
    k[c] = attn.k_in(c);
    v[c] = attn.v_in(c);
  }
  launch_embedding_forward(tok.get(), tok_emb_.get(), x.get(), T, D, st);
  for (size_t li = 0; li < layers_.size(); ++li) {
    const LayerWeights& w = layers_[li];
    launch_rmsnorm_forward(x.get(), w.attn_norm.get(), eps, h.get(), rstd.get(), T, D, st);
    gemm_.linear_forward(h.get(), w.w_in.get(), f32(proj.get()), T, D, W, 0.0f, st);
    launch_decode_inputs(proj.get(), in, pos.get(), w.bg.get(), cfg_.rope_base, T, st);
    attn.forward(st);
    attn_[li]->prefill(k, v, cu.get(), seq.get(), n, group.max_length, st);
    gemm_.linear_forward(attn.o_out(), w.wo.get(), f32(x.get()), T, H * a.dv, D, 1.0f, st);
    launch_rmsnorm_forward(x.get(), w.ffn_norm.get(), eps, h.get(), rstd.get(), T, D, st);
    gemm_.linear_forward(h.get(), w.w1.get(), b16(u1.get()), T, D, F, 0.0f, st);
    if (swiglu) gemm_.linear_forward(h.get(), w.w3.get(), b16(u3.get()), T, D, F, 0.0f, st);
    launch_swiglu_forward(u1.get(), swiglu ? u3.get() : nullptr, m.get(), T * F, st);
    gemm_.linear_forward(m.get(), w.w2.get(), f32(x.get()), T, F, D, 1.0f, st);
  }
  // The head on each prompt's last row only.
  DeviceBuffer<float> x_last(n * D), rstd_last(n), logits_last(n * V);
  DeviceBuffer<bf16> h_last(n * D);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t last = group.layout.start(i) + group.layout.length(i) - 1;
    NSA_CUDA_CHECK(cudaMemcpyAsync(x_last.get() + i * D, x.get() + last * D, D * sizeof(float),
                                   cudaMemcpyDeviceToDevice, st));
  }
  launch_rmsnorm_forward(x_last.get(), norm_.get(), eps, h_last.get(), rstd_last.get(), n, D, st);
  gemm_.linear_forward(h_last.get(), head_.get(), f32(logits_last.get()), n, D, V, 0.0f, st);
  std::vector<float> host(static_cast<size_t>(n * V));
  NSA_CUDA_CHECK(cudaMemcpyAsync(host.data(), logits_last.get(), host.size() * sizeof(float),
                                 cudaMemcpyDeviceToHost, st));
  NSA_CUDA_CHECK(cudaStreamSynchronize(st));  // before the group's buffers are freed
  for (int64_t i = 0; i < n; ++i) {
    std::copy_n(host.begin() + i * V, V, logits.begin() + group.seqs[i] * V);
  }
}

}  // namespace nsa::cuda
