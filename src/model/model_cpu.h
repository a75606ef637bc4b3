// The NSA language model on the CPU: loss, and gradients of every parameter (docs/training.md,
// "Model").
//
// embedding → n_layers × [RMSNorm → Q, K/V per branch (RoPE on Q and every K, before
// compression), gates = sigmoid|softmax(h·Wgᵀ + bg) → NSA attention → Wo → residual; RMSNorm →
// SwiGLU or SiLU MLP → residual] → RMSNorm → LM head → mean cross-entropy.
// This is the reference the CUDA model will be judged against; it keeps every activation of the
// forward for the backward (no recomputation) and is O(S) in memory like the attention.
#pragma once

#include <cstdint>
#include <type_traits>
#include <vector>

#include "attention_mass.h"
#include "model_params.h"
#include "nsa/tensor.h"

namespace nsa {

// What the forward saw, for metrics: mean gate value per branch (over layers, tokens and heads).
struct ModelStats {
  double gate_mean[kNumBranches] = {0, 0, 0};
  // Selection statistics over all layers: how far back the freely chosen (non-forced) blocks lie,
  // in blocks from the query's own block c; bucket k counts distances in [2^k, 2^(k+1)), k < 16.
  int64_t sel_distance_hist[16] = {};
  // Anomaly mode: check every layer's activations and gradients, and every parameter gradient,
  // for NaN/Inf and throw nsa::Error naming the first bad tensor (docs/training.md, "Diagnostics").
  bool check_finite = false;
  // Per-layer telemetry (docs/training.md, "Every step"), one entry per layer: wall time of its
  // forward and backward (GPU: CUDA events; with recompute the backward includes the recomputed
  // forward), and the bytes its saved activations hold until the backward.
  std::vector<double> layer_forward_ms, layer_backward_ms;
  std::vector<int64_t> layer_bytes;
  bool keep_outputs = false;             // set to also keep the three below (tests, tools)
  Tensor<float> logits;                  // [T, vocab]
  std::vector<Tensor<int32_t>> sel_idx;  // per layer [T, G, n_sel]
  std::vector<Tensor<float>> gates;      // per layer [T, H, 3]: each branch's gate as NSA took it
  bool keep_token_losses = false;        // set to keep the one below (loss by position)
  std::vector<double> token_loss;        // [T]: each token's cross-entropy, the loss's terms
  // Set to have each layer's attention mass of these rows on these spans (the CPU model only;
  // the needle probe): per layer [queries, H, 3] in branch order, attention_mass.h.
  std::vector<MassQuery> mass_queries;
  std::vector<std::vector<float>> attention_mass;
};

// ModelStats::sel_distance_hist's rule, for one layer: adds the freely chosen blocks of its
// selection sel_idx [T, G, n_sel] (`layout`'s tokens, blocks of l_sel tokens) into hist.
void add_sel_distance_hist(const SeqLayout& layout, int64_t l_sel, const Tensor<int32_t>& sel_idx,
                           int64_t (&hist)[16]);

// What the needle probe reads (train/needle_eval.h) at chosen token rows of a pass kept with
// keep_outputs: per layer, the selection [rows.size(), G, n_sel] and the gates [rows.size(), H, 3].
struct ProbeRows {
  std::vector<std::vector<int32_t>> sel;
  std::vector<std::vector<float>> gates;
  // Asked by the caller (mass_queries, read by logit_rows_cpu) and answered by the CPU model only
  // (mass empty from a GPU one): each layer's attention mass, as ModelStats::attention_mass.
  std::vector<MassQuery> mass_queries;
  std::vector<std::vector<float>> mass;
};
ProbeRows gather_probe_rows(const ModelStats& stats, const std::vector<int64_t>& rows);

// tokens, targets [T] laid out by `layout` (positions restart in each sequence). Returns the mean
// loss; when grads != nullptr, adds every parameter's gradient into it; fills stats if given.
template <typename Real>
double model_loss_cpu(const ModelConfig& cfg, const ModelParams<Real>& params,
                      const SeqLayout& layout, const std::vector<int32_t>& tokens,
                      const std::vector<int32_t>& targets,
                      std::type_identity_t<ModelParams<Real>>* grads, ModelStats* stats = nullptr);

}  // namespace nsa
