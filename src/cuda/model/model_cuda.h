// The NSA language model on one GPU: the model of model/model_cpu.h (same parameters, names and
// math), with GEMMs on cuBLASLt (bf16 operands, fp32 accumulation), the NSA CUDA kernels, fp32
// master weights, gradients and AdamW moments, and an fp32 residual stream.
//
// Activation memory: the input of every layer is kept (fp32 [T, dim] each); the rest of a layer's
// activations (norms, projections, NSA state, MLP inputs) lives in a workspace – one per layer, or
// with `recompute` a single one that the backward refills by running each layer's forward again.
// What a backward needs only while it runs (the NSA gradients and partial sums, the MLP product
// silu(u1)·u3, recomputed) is one set shared by all layers.
// Everything is deterministic (no atomics anywhere), so a step is bit-identical across runs and
// recompute on = off bitwise. One host synchronisation per micro-batch (to read the loss) and one
// per optimizer step (the gradient norm for clipping).
#pragma once

#include <cuda_runtime.h>

#include <functional>
#include <memory>
#include <vector>

#include "common/device_buffer.h"
#include "gemm.h"
#include "model/model_cpu.h"
#include "model/model_params.h"
#include "model_ops.h"
#include "train/adamw.h"

namespace nsa::cuda {

class NsaCudaLayer;
struct NsaBackwardBuffers;

// The config, validated, when a GPU is present and the GPU model supports it (φ = avg); throws
// nsa::Error otherwise. GPU classes call it in their first member's initialiser, before anything
// touches the device.
const ModelConfig& checked_for_gpu(const ModelConfig& cfg);

class ModelCuda {
 public:
  // Throws nsa::Error without a GPU, for φ = mlp (not on the GPU model yet), or for head dims the
  // attention kernels are not built for.
  ModelCuda(const ModelConfig& cfg, const SeqLayout& layout, bool recompute);
  ~ModelCuda();
  ModelCuda(const ModelCuda&) = delete;
  ModelCuda& operator=(const ModelCuda&) = delete;

  // fp32 weights in and out (the order and shapes of ModelParams::named).
  void set_params(ModelParams<float>& params);
  void get_params(ModelParams<float>& params);
  void get_grads(ModelParams<float>& grads);
  // AdamW moments, one tensor per parameter in named order. Sharded (ZeRO-1), only this rank's
  // slice goes up, and `gather` (every rank's slice of a flat buffer of flat_size() floats, e.g.
  // Communicator::allgather_ranges) completes the moments that come down.
  using GatherFlat = std::function<void(std::vector<float>& flat)>;
  void set_adam_state(const std::vector<Tensor<float>>& m, const std::vector<Tensor<float>>& v);
  void get_adam_state(std::vector<Tensor<float>>& m, std::vector<Tensor<float>>& v,
                      const GatherFlat& gather = nullptr);

  // ZeRO-1: keep AdamW moments for, and update, only the flat elements [lo, hi) of the
  // flat_size() laid out as the parameter buffer (the moments held so far are kept for that
  // slice). After optimizer_step the rest of the weights are stale until every rank's slice is
  // put together: download_param_slice, gather across ranks, upload_params_flat.
  int64_t flat_size() const { return params_.size(); }
  void shard_optimizer(int64_t lo, int64_t hi);
  void download_param_slice(std::vector<float>& flat);  // flat [flat_size()]; fills [lo, hi)
  void upload_params_flat(const std::vector<float>& flat);

  void zero_grads();
  // The whole gradient buffer (alignment padding included, always zero) to and from the host.
  // The flat fp32 gradient buffer on the device (for collectives) and the model's stream.
  float* grads_device() { return grads_.get(); }
  int64_t grads_size() const { return grads_.size(); }
  cudaStream_t stream() const { return stream_; }
  void download_grads_flat(std::vector<float>& host);
  void upload_grads_flat(const std::vector<float>& host);
  // One micro-batch laid out as the constructor's layout: returns its mean loss; with `backward`
  // adds every parameter's gradient into the gradient buffer. stats: gate means (the selection
  // histogram is not collected on the GPU).
  double forward_backward(const std::vector<int32_t>& tokens, const std::vector<int32_t>& targets,
                          bool backward, ModelStats* stats = nullptr);
  // The logits of token rows `rows` of the last forward_backward, [rows.size(), vocab] (fp32).
  void download_logit_rows(const std::vector<int64_t>& rows, std::vector<float>& out);
  // AdamW on the gradients times grad_scale (1/accumulation), clipped; returns the pre-clip norm of
  // the scaled gradients.
  double optimizer_step(const AdamWConfig& adam, int64_t step, double grad_scale);

  size_t device_bytes() const;

 private:
  struct Workspace;
  struct Slot {
    int64_t offset = 0, numel = 0;
    bool decay = false;
  };
  struct LayerSlots {
    int attn_norm, wq, wk[3], wv[3], wg, bg, wo, ffn_norm, w1, w2, w3;
  };

  float* P(int slot) { return params_.get() + slots_[slot].offset; }
  bf16* Pb(int slot) { return params_bf16_.get() + slots_[slot].offset; }
  float* G(int slot) { return grads_.get() + slots_[slot].offset; }
  void copy_slots(const std::vector<float*>& host, float* dev, bool upload);
  void copy_named(ModelParams<float>& params, float* dev, bool upload);
  void check_moments(const std::vector<Tensor<float>>& t) const;  // one per slot, slot-sized
  void layer_forward(int64_t li, Workspace& ws, const float* x_in, float* x_out);
  void layer_backward(int64_t li, Workspace& ws, const float* x_in, float* dx);

  ModelConfig cfg_;
  bool recompute_;
  int64_t T_, F_;
  cudaStream_t stream_ = nullptr;
  Gemm gemm_;
  std::vector<Slot> slots_;
  std::vector<LayerSlots> layer_slots_;
  int tok_emb_ = 0, norm_ = 0, output_ = -1;
  DeviceBuffer<float> params_, grads_, adam_m_, adam_v_;  // moments: [shard_hi_ − shard_lo_]
  int64_t shard_lo_ = 0, shard_hi_ = 0;                   // ZeRO-1 slice, or the whole buffer
  DeviceBuffer<bf16> params_bf16_;
  std::shared_ptr<NsaBackwardBuffers> nsa_backward_;  // shared by every layer's NsaCudaLayer
  std::vector<std::unique_ptr<Workspace>> workspaces_;
  std::vector<DeviceBuffer<float>> xs_;  // layer inputs; xs_[L] = the final norm's input
  DeviceBuffer<int32_t> tokens_, targets_, positions_, emb_order_, emb_seg_token_, emb_seg_start_;
  // Scratch shared by all layers.
  DeviceBuffer<float> proj_, dx_, dh_, dm_, dz_, norm_partial_, sum_partial_, logits_, row_loss_;
  DeviceBuffer<float> scalars_;  // [0] loss, [1..3] gate sums, [4] squared gradient norm
  DeviceBuffer<bf16> hf_, dlogits_, dx_bf_, m_, du1_, du3_, dz_bf_, dq_bf_, dkv_bf_;
  DeviceBuffer<float> rstdf_;
  // Per-layer telemetry: events around each layer's forward and backward ([2·li], [2·li + 1]).
  std::vector<cudaEvent_t> fwd_events_, bwd_events_;
};

}  // namespace nsa::cuda
