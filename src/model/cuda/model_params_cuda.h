// The GPU model's parameter state: fp32 master weights, their bf16 copies (what the GEMMs read)
// and fp32 gradients, each one flat device buffer cut into slots in the named (checkpoint) order
// of ModelParams. The passes (model_cuda.h) read and write slots; the optimizer (the training
// layer's train/cuda/adamw_cuda.h) updates the flat buffers. Kept apart from the passes so that
// the model layer knows nothing of optimizers.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <vector>

#include "cuda/common/device_buffer.h"
#include "model/cuda/model_ops.h"
#include "model/model_params.h"

namespace nsa::cuda {

class ModelParamsCuda {
 public:
  // One parameter tensor in the flat buffers: [offset, offset + numel), then zero padding up to
  // offset + reserved (a matrix's rows rounded up to a multiple of 8, then to 128 elements);
  // `decay`: a matrix (weight decay applies); its checkpoint name and shape (for messages).
  struct Slot {
    int64_t offset = 0, numel = 0, reserved = 0;
    bool decay = false;
    std::string name;
    Shape shape;
  };
  // The slot index of each tensor of one transformer layer (wk/wv per branch: kv_index applied;
  // phi[0] keys, phi[1] values, in PhiMlpParams order pos, w1, b1, w2, b2 – φ = mlp only, else -1).
  struct LayerSlots {
    int attn_norm, wq, wk[3], wv[3], wg, bg, wo, ffn_norm, w1, w2, w3;
    int phi[2][kPhiMlpTensors];
  };

  // Lays out the slots and uploads the config's seeded initial weights; gradients start at zero.
  // Copies run on `stream` (the model's, non-blocking) and are synchronised.
  ModelParamsCuda(const ModelConfig& cfg, cudaStream_t stream);

  float* weight(int slot) { return weights_.get() + slots_[slot].offset; }
  const float* weight(int slot) const { return weights_.get() + slots_[slot].offset; }
  bf16* weight_bf16(int slot) { return weights_bf16_.get() + slots_[slot].offset; }
  float* grad(int slot) { return grads_.get() + slots_[slot].offset; }
  const std::vector<Slot>& slots() const { return slots_; }
  const LayerSlots& layer(int64_t li) const { return layer_slots_[li]; }
  // Where layer li's parameters start in the flat buffers (named order: the token embedding,
  // the layers, the final norm and LM head); layer_begin(n_layers) is where the layers end.
  int64_t layer_begin(int64_t li) const;
  int tok_emb_slot() const { return tok_emb_slot_; }
  int norm_slot() const { return norm_slot_; }
  int output_slot() const { return output_slot_; }

  // The flat buffers (alignment padding included, always zero), for optimizers and collectives.
  int64_t flat_size() const { return weights_.size(); }
  float* weights_flat() { return weights_.get(); }
  bf16* weights_bf16_flat() { return weights_bf16_.get(); }
  float* grads_flat() { return grads_.get(); }

  // fp32 weights in and out (the order and shapes of ModelParams::named); setting refreshes the
  // bf16 copies.
  void set(ModelParams<float>& params);
  void get(ModelParams<float>& params);
  void get_grads(ModelParams<float>& grads);
  // The whole flat weight buffer up (bf16 copies refreshed), or the elements [lo, hi) of it down
  // into flat [flat_size()].
  void upload_weights_flat(const std::vector<float>& flat);
  // The bf16 copies made again from the fp32 weights (on the stream): after the flat fp32 buffer
  // was written on the device, e.g. by ZeRO-1's NCCL gather.
  void refresh_bf16();
  void download_weights_range(int64_t lo, int64_t hi, std::vector<float>& flat);

  void zero_grads();
  void download_grads_flat(std::vector<float>& host);
  void upload_grads_flat(const std::vector<float>& host);

  size_t device_bytes() const { return weights_.bytes() + weights_bf16_.bytes() + grads_.bytes(); }

 private:
  void copy_slots(const std::vector<float*>& host, float* dev, bool upload);
  void copy_named(ModelParams<float>& params, float* dev, bool upload);

  ModelConfig cfg_;
  cudaStream_t stream_;
  std::vector<Slot> slots_;
  std::vector<LayerSlots> layer_slots_;
  int tok_emb_slot_ = 0, norm_slot_ = 0, output_slot_ = -1;
  DeviceBuffer<float> weights_, grads_;
  DeviceBuffer<bf16> weights_bf16_;
};

}  // namespace nsa::cuda
