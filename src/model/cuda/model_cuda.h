// The NSA language model on one GPU: the model of model/model_cpu.h (same parameters, names and
// math), with GEMMs on cuBLASLt (bf16 operands, fp32 accumulation), the NSA CUDA kernels, fp32
// master weights and gradients (model_params_cuda.h), and an fp32 residual stream. The optimizer
// (AdamW, ZeRO-1) belongs to the training layer: train/cuda/adamw_cuda.h.
//
// Activation memory (nsa/recompute.h): the input of every layer is kept (fp32 [T, dim] each);
// the rest of a layer's activations lives in a workspace. Recompute::kNone: one per layer, all
// kept. kOps: the attention's state per layer but its queries; the norms' outputs, the queries,
// the attention's residual sum and the MLP's up-projections are shared by all layers and
// recomputed per op in the backward (the same kernels on the same inputs: the same bits).
// kLayers: a single workspace that the backward refills by running each layer's forward again.
// What a backward needs only while it runs (the NSA gradients and partial sums, the MLP product
// silu(u1)·u3, recomputed) is one set shared by all layers.
// φ = mlp: the compression MLPs' parameters live in the flat weight buffer with the others (so the
// optimizer, checkpoints and collectives see them); the attention layer reads them in place and
// its parameter gradients are added into the flat gradient buffer after each layer's backward.
// Everything is deterministic (no floating-point atomics), so a step is bit-identical across runs
// and every recompute policy gives the same bits. One host synchronisation per micro-batch (to read
// the loss and the metrics) and one per optimizer step (the gradient norm for clipping); anomaly
// mode (ModelStats::check_finite) adds one per checked tensor.
//
// Phase timing (phase_timer.h, off unless turned on: `nsa bench train`): the passes mark where
// each phase of the step begins on the stream.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "cuda/common/device_buffer.h"
#include "model/cuda/gemm.h"
#include "model/cuda/model_ops.h"
#include "model/cuda/model_params_cuda.h"
#include "model/cuda/phase_timer.h"
#include "model/model_cpu.h"
#include "model/model_params.h"
#include "nsa/recompute.h"

namespace nsa::cuda {

class NsaCudaLayer;
struct NsaBackwardBuffers;

// The config, validated, when a GPU is present; throws nsa::Error otherwise. GPU classes call it
// in their first member's initialiser, before anything touches the device.
const ModelConfig& checked_for_gpu(const ModelConfig& cfg);

class ModelCuda {
 public:
  // Throws nsa::Error without a GPU, or for head dims the attention kernels are not built for.
  ModelCuda(const ModelConfig& cfg, const SeqLayout& layout, Recompute recompute);
  ~ModelCuda();
  ModelCuda(const ModelCuda&) = delete;
  ModelCuda& operator=(const ModelCuda&) = delete;

  // The weights, bf16 copies and gradients the passes read and write.
  ModelParamsCuda& params() { return params_; }
  // fp32 weights in and out (the order and shapes of ModelParams::named).
  void set_params(ModelParams<float>& params) { params_.set(params); }
  void get_params(ModelParams<float>& params) { params_.get(params); }
  void get_grads(ModelParams<float>& grads) { params_.get_grads(grads); }

  void zero_grads() { params_.zero_grads(); }
  // The flat fp32 gradient buffer on the device (for collectives) and the model's stream.
  float* grads_device() { return params_.grads_flat(); }
  int64_t grads_size() const { return params_.flat_size(); }
  cudaStream_t stream() const { return stream_; }
  // One micro-batch laid out as the constructor's layout: returns its mean loss; with `backward`
  // adds every parameter's gradient into the gradient buffer. stats (as model_loss_cpu fills
  // them): gate means, the selection-distance histogram, per-layer times and bytes; with
  // check_finite the CPU model's anomaly checks (the same tensors in the same order, the same
  // message – where the GPU adds a product straight into the residual stream, the sum is
  // checked); keep_outputs and keep_token_losses download the logits, every layer's selection and
  // gates, and the token losses.
  double forward_backward(const std::vector<int32_t>& tokens, const std::vector<int32_t>& targets,
                          bool backward, ModelStats* stats = nullptr);
  // The logits of token rows `rows` of the last forward_backward, [rows.size(), vocab] (fp32):
  // after a pass with keep_logits(true) (or keep_outputs / check_finite), which keeps the whole
  // batch's logits; otherwise the LM head runs in row chunks (about 256 MiB of logits at a time)
  // and the logits do not outlive their chunk.
  void download_logit_rows(const std::vector<int64_t>& rows, std::vector<float>& out);
  void keep_logits(bool on) { keep_logits_ = on; }
  // Tests: the LM head's row chunk (default: from the vocabulary size).
  void set_logit_chunk_rows(int64_t rows) { logit_chunk_rows_ = std::max<int64_t>(1, rows); }
  // Each token's loss of the last forward_backward, [T] (fp32; their mean is its loss).
  void download_token_losses(std::vector<float>& out);
  // Called during a backward (on the host, in stream order) each time a part of the gradient
  // buffer, flat elements [lo, hi), is final: the LM head's and final norm's (the buffer's end),
  // each layer's (last to first), the token embedding's (its start) – so that the trainer can sum
  // it across ranks while the backward goes on. Empty: not called.
  using GradsReady = std::function<void(int64_t lo, int64_t hi)>;
  void set_grads_ready(GradsReady ready) { grads_ready_ = std::move(ready); }
  // Σ g² over the whole gradient buffer (fixed-order reduction; synchronises), for the gradient
  // norm of clipping.
  float grad_sum_of_squares();

  // The passes' buffers and the parameter state (weights, bf16 copies, gradients); no optimizer.
  size_t device_bytes() const;

  // Whether the attention projections' gradients take one GEMM pair (their weights lie back to
  // back in the parameter buffer) or a pair each – the tests check which path a shape runs.
  bool projection_grads_in_one_gemm() const { return proj_one_gemm_; }

  // Phase timing of the step's work on the model's stream (the optimizer and the trainer mark
  // their phases on it too).
  PhaseTimer& phase_timer() { return timer_; }

 private:
  struct Workspace;
  // step_scalars_ entries: the micro-batch loss, the gate sums of the three branches, Σ g².
  enum Scalar { kLoss = 0, kGateSum = 1, kGradSquares = 4, kNumScalars = 8 };

  // recomputing: the backward's second forward of the layer (no anomaly checks: bit-identical).
  void layer_forward(int64_t li, Workspace& ws, const float* x_in, float* x_out, bool recomputing);
  void layer_backward(int64_t li, Workspace& ws, const float* x_in, float* dx);
  // Pieces of the forward the backward runs again with Recompute::kOps (check: anomaly checks).
  void attention_norm_forward(int64_t li, Workspace& ws, const float* x_in, bool check);
  void query_forward(int64_t li, Workspace& ws);
  void mlp_inputs_forward(int64_t li, Workspace& ws, const float* x_in, bool check);
  Workspace& workspace(int64_t li) {
    return *workspaces_[recompute_ == Recompute::kLayers ? 0 : li];
  }
  void mark(StepPhase phase) { timer_.mark(phase, stream_); }
  // Anomaly mode: throws naming `what` when x [numel(shape)] holds a NaN or ±Inf (synchronises);
  // nothing unless this micro-batch checks.
  template <typename T>
  void check_finite(const T* x, const Shape& shape, const std::string& what);

  ModelConfig cfg_;
  Recompute recompute_;
  int64_t n_tokens_, ffn_dim_;  // tokens per micro-batch (T), MLP hidden width (F)
  cudaStream_t stream_ = nullptr;
  Gemm gemm_;
  ModelParamsCuda params_;
  std::shared_ptr<NsaBackwardBuffers> nsa_backward_;  // shared by every layer's NsaCudaLayer
  std::vector<std::unique_ptr<Workspace>> workspaces_;
  std::vector<DeviceBuffer<float>> layer_inputs_;  // [L + 1]; [L] = the final norm's input
  DeviceBuffer<int32_t> tokens_, targets_, positions_;
  DeviceBuffer<float2> rope_table_;  // (cos, sin) per (position, channel pair): launch_rope_table
  // The embedding backward's rows grouped by token (order, segment tokens, segment starts).
  DeviceBuffer<int32_t> emb_order_, emb_seg_token_, emb_seg_start_;
  // Scratch shared by all layers: fp32 [T, ·] projection outputs before RoPE / conversion, the
  // residual gradient dx, the gradient into a norm's output, the gate logits' gradient, reduction
  // partial sums, logits and per-row losses.
  // (Recompute::kOps: proj_out_ also holds x2, and the layers share h1/h2, u1, u3 and the queries
  // below.)
  DeviceBuffer<float> proj_out_, residual_grad_, norm_out_grad_, gate_logit_grad_;
  DeviceBuffer<float> norm_partial_, sum_partial_, logits_, row_loss_;
  // The LM head's rows per chunk; keep the whole batch's logits (download_logit_rows); whether
  // the last pass did.
  int64_t logit_chunk_rows_ = 0;
  bool keep_logits_ = false, logits_whole_ = false;
  GradsReady grads_ready_;            // set_grads_ready
  DeviceBuffer<float> step_scalars_;  // [kNumScalars], see Scalar
  // bf16 [T, ·]: the final norm's output, the logits' gradient, dx, the MLP activation
  // silu(u1)·u3 and its gradient, the gradients of u1 and u3.
  DeviceBuffer<bf16> final_norm_out_, logits_grad_bf_, residual_grad_bf_, mlp_act_bf_;
  DeviceBuffer<bf16> mlp_act_grad_bf_;
  DeviceBuffer<bf16> up1_grad_bf_, up3_grad_bf_;
  DeviceBuffer<bf16> shared_h_, shared_u1_, shared_u3_, shared_q_;  // Recompute::kOps only
  // The attention projections' output gradients side by side, bf16 [T, proj_ld_]: one part per
  // projection in the order of their weights in the parameter buffer – q, then k and v of each
  // branch with its own K/V, then the gate logits. When those weights lie back to back
  // (proj_one_gemm_), one GEMM gives the input gradient of all of them and one their weight
  // gradients; else each part its own, at a 256-byte-aligned column. This one list drives the
  // check, the columns and the backward's writes and GEMMs.
  struct ProjPart {
    enum Kind { kQuery, kKey, kValue, kGate } kind;
    int branch;          // kKey, kValue: whose K/V
    int64_t width, col;  // columns, and the first of them in proj_grad_bf_
    int slot(const ModelParamsCuda::LayerSlots& s) const {
      return kind == kQuery   ? s.wq
             : kind == kKey   ? s.wk[branch]
             : kind == kValue ? s.wv[branch]
                              : s.wg;
    }
  };
  std::vector<ProjPart> proj_parts_;
  int64_t proj_ld_ = 0, proj_gemm_width_ = 0;  // the one GEMM's K and N: the slots' reserved rows
  bool proj_one_gemm_ = false;
  DeviceBuffer<bf16> proj_grad_bf_;
  DeviceBuffer<float> final_norm_rstd_;
  // Per-layer telemetry: events around each layer's forward and backward ([2·li], [2·li + 1]).
  std::vector<cudaEvent_t> fwd_events_, bwd_events_;
  // Metrics and anomaly mode: the selection-distance histogram, the last check's answer.
  DeviceBuffer<unsigned long long> sel_hist_;
  DeviceBuffer<NonFiniteHit> nonfinite_;
  bool checking_ = false;  // this micro-batch runs the anomaly checks
  PhaseTimer timer_;
};

}  // namespace nsa::cuda
