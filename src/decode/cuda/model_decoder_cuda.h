// Incremental decoding of the NSA language model on one GPU (docs/inference.md, "Decoding on the
// GPU"): a batch of B independent sequences, one token each per step, with per-layer NSA caches
// (nsa/nsa_decode.h). The same weights and math as the CPU decoder (decode/model_decoder.h) with
// bf16 GEMM operands and caches.
//
// A step is launched as a CUDA graph captured on first use: every position lives on the device
// (advanced by the step's last kernel), so the host only uploads the tokens, replays the graph and
// reads the logits. `dense` swaps NSA for full causal attention over the selected branch's K/V –
// the baseline of `nsa bench decode`, the same model otherwise.
//
// Prompts are prefilled in one pass (model_decoder_prefill.cpp): the model's forward over all
// prompts packed back to back (cu_seqlens; the training attention kernels, NsaCudaLayer) with the
// decoder's own weights and per-token ops, whose K/V fill the decode caches directly
// (NsaDecodeCuda::prefill); each sequence then decodes on from its own prompt length.
#pragma once

#include <cuda_runtime.h>

#include <memory>
#include <vector>

#include "cuda/common/device_buffer.h"
#include "cuda/nsa/nsa_decode.h"
#include "decode/prefill_plan.h"
#include "model/cuda/gemm.h"
#include "model/cuda/gemv.h"
#include "model/cuda/model_ops.h"
#include "model/model_params.h"

namespace nsa::cuda {

class ModelDecoderCuda {
 public:
  ModelDecoderCuda(const ModelConfig& cfg, const ModelParams<float>& params, int64_t batch,
                   int64_t max_len, bool dense);
  ~ModelDecoderCuda();
  ModelDecoderCuda(const ModelDecoderCuda&) = delete;
  ModelDecoderCuda& operator=(const ModelDecoderCuda&) = delete;

  // Tokens a prefill packs into one forward at most (a longer prompt runs alone): bounds the
  // forward's buffers, about 57 KB per token for m7c_125m (docs/inference.md, "Prefill").
  static constexpr int64_t kPrefillTokenBudget = int64_t{1} << 17;

  // Feeds one prompt per sequence [B] to a fresh decoder (every position 0) in one forward per
  // group of prompts (see plan_prefill: prompts identical to an earlier one copy its caches);
  // returns the logits after each prompt's last token [B, vocab]. Sequence b is then at position
  // |prompts[b]|. Throws nsa::Error for dense decoding, a wrong number of prompts, an empty or
  // too long prompt, a token outside the vocabulary, or a decoder that has stepped (see reset).
  std::vector<float> prefill(const std::vector<std::vector<int32_t>>& prompts,
                             int64_t token_budget = kPrefillTokenBudget);
  // Feeds tokens [B], each at its sequence's position; returns the next-token logits [B, vocab].
  std::vector<float> step(const std::vector<int32_t>& tokens);
  // One step on the tokens already on the device, not waited for (benchmarks time it on stream()).
  void step_async();
  // For benchmarks: every sequence holds `len` tokens of random K/V; the position becomes len.
  void fill_random(int64_t len, uint64_t seed);
  // Every sequence back to position 0 (the caches are overwritten as they fill again).
  void reset();
  // Phase timestamps of every layer's attention kernels inside the model's step (`nsa bench decode
  // --trace`; NSA only): the steps after this call run traced – the step is captured again – and
  // trace() gives a slot per layer (the last traced step's), to set beside the attention-only
  // trace. Throws nsa::Error for dense decoding.
  void enable_trace();
  NsaDecodeCuda::Trace trace() const;  // waits for the device

  // The furthest position of any sequence, and each sequence's (the tokens its caches hold).
  int64_t position() const;
  const std::vector<int64_t>& lengths() const { return lens_; }
  // Selected blocks of the last step in `layer`, [B, G, n_sel] (NSA only).
  std::vector<int32_t> selection(int64_t layer) const;
  // K/V bytes the attention reads per step at the current position, all layers and sequences.
  int64_t kv_bytes_per_step() const;
  size_t device_bytes() const;
  cudaStream_t stream() const { return stream_; }

 private:
  struct LayerWeights {
    DeviceBuffer<float> attn_norm, bg, ffn_norm;
    // [wq; wk of each branch with its own K/V; wv likewise; wg] – one GEMM for the attention
    // inputs (dense decoding: wq and the selected branch's wk, wv only).
    DeviceBuffer<bf16> w_in, wo, w1, w2, w3;
  };
  void record_step();  // the kernels of one step, on stream_
  // The step's linear layers: the few-row kernels (model/cuda/gemv.h) up to kGemvFasterRows rows
  // where they fit (few_rows), else the tensor-core skinny kernels (skinny_gemm.h) up to
  // kSkinnyMaxRows, both with the RMSNorm folded in where x is normalised (small_linear, and
  // small_swiglu for the MLP's first half into m_; false: neither takes it), else the norm kernel
  // and the GEMMs.
  bool few_rows(int64_t in, const GemvInput& x, const bf16* w, const bf16* w3 = nullptr) const;
  bool small_linear(const GemvInput& x, const bf16* w, GemmOut y, int64_t in, int64_t out,
                    float beta, cudaStream_t st);
  bool small_swiglu(const GemvInput& x, const bf16* w1, const bf16* w3, cudaStream_t st);
  // y (+)= x·Wᵀ for the step's B_ rows: small_linear where it takes them, else the GEMM.
  void rows_linear(const bf16* x, const bf16* w, GemmOut y, int64_t in, int64_t out, float beta,
                   cudaStream_t st);
  // y = RMSNorm(x_; norm_w)·Wᵀ.
  void normed_linear(const float* norm_w, const bf16* w, GemmOut y, int64_t out, cudaStream_t st);
  // The attention inputs (q_, k_, v_, gates_) of RMSNorm(x_; attn_norm) at positions_: one kernel
  // where the few-row path takes it (model/cuda/decode_projection.h), else the product into proj_
  // and launch_decode_inputs.
  void attention_inputs(const LayerWeights& w, cudaStream_t st);
  // x_ += x·Wᵀ.
  void residual_linear(const bf16* x, const bf16* w, int64_t in, cudaStream_t st);
  // m_ = the MLP's activation of RMSNorm(x_; ffn_norm).
  void mlp_in(const LayerWeights& w, cudaStream_t st);
  // One forward of the prefill over a group's packed prompts: fills their caches and writes
  // their rows of logits [B, vocab] (model_decoder_prefill.cpp).
  void prefill_group(const PrefillGroup& group, const std::vector<std::vector<int32_t>>& prompts,
                     std::vector<float>& logits);
  void upload_positions();  // lens_ → positions_

  ModelConfig cfg_;
  int64_t B_, max_len_, F_;
  std::vector<int64_t> lens_;  // per sequence: its position (the tokens its caches hold)
  bool dense_;
  cudaStream_t stream_ = nullptr;
  cudaGraphExec_t graph_ = nullptr;
  Gemm gemm_;
  DeviceBuffer<float> tok_emb_, norm_;
  DeviceBuffer<bf16> head_;  // LM head (the embedding when tied)
  std::vector<LayerWeights> layers_;
  DecodeInputs inputs_{};  // offsets into the fused projection and the output buffers
  std::vector<std::unique_ptr<NsaDecodeCuda>> attn_;
  DeviceBuffer<int32_t> tokens_, positions_;
  DeviceBuffer<float> x_, proj_, rstd_, logits_;
  DeviceBuffer<bf16> h_, q_, k_[3], v_[3], gates_[3], o_, u1_, u3_, m_;
};

}  // namespace nsa::cuda
