// Incremental decoding of the NSA language model on one GPU (docs/inference.md, "Decoding on the
// GPU"): a batch of B independent sequences, one token each per step, with per-layer NSA caches
// (nsa/nsa_decode.h). The same weights and math as the CPU decoder (decode/model_decoder.h) with
// bf16 GEMM operands and caches.
//
// A step is launched as a CUDA graph captured on first use: every position lives on the device
// (advanced by the step's last kernel), so the host only uploads the tokens, replays the graph and
// reads the logits. `dense` swaps NSA for full causal attention over the selected branch's K/V –
// the baseline of `nsa bench decode`, the same model otherwise.
#pragma once

#include <cuda_runtime.h>

#include <memory>
#include <vector>

#include "cuda/common/device_buffer.h"
#include "model/cuda/gemm.h"
#include "model/cuda/model_ops.h"
#include "model/model_params.h"

namespace nsa::cuda {

class NsaDecodeCuda;

class ModelDecoderCuda {
 public:
  ModelDecoderCuda(const ModelConfig& cfg, const ModelParams<float>& params, int64_t batch,
                   int64_t max_len, bool dense);
  ~ModelDecoderCuda();
  ModelDecoderCuda(const ModelDecoderCuda&) = delete;
  ModelDecoderCuda& operator=(const ModelDecoderCuda&) = delete;

  // Feeds tokens [B] at the current position; returns the next-token logits [B, vocab].
  std::vector<float> step(const std::vector<int32_t>& tokens);
  // One step on the tokens already on the device, not waited for (benchmarks time it on stream()).
  void step_async();
  // For benchmarks: every sequence holds `len` tokens of random K/V; the position becomes len.
  void fill_random(int64_t len, uint64_t seed);

  int64_t position() const { return pos_; }
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

  ModelConfig cfg_;
  int64_t B_, max_len_, F_, pos_ = 0;
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
