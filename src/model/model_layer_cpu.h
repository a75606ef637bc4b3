// One transformer block of the CPU model (model_cpu.h), forward and backward: the GPU model's
// layer_forward / layer_backward on the CPU. model_cpu.cpp runs the embedding, the blocks and the
// head around them. Internal to the model layer.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "model_cpu.h"

namespace nsa {

// Everything one layer's backward needs from its forward.
template <typename Real>
struct LayerActivations {
  Tensor<Real> x, h1, rstd1;            // layer input, normed input, its rstd
  NsaTensors<Real> attn_in;             // q, k, v (rotated), gate values (masked), φ params
  Tensor<Real> gate_raw[kNumBranches];  // gate values before the branches mask
  NsaForward<Real> attn;                // attention forward state
  Tensor<Real> o_flat;                  // [T, H·dv]
  Tensor<Real> x2, h2, rstd2;           // after attention residual, normed, rstd
  Tensor<Real> u1, u3, m;               // MLP pre-activations and activation
};

// Anomaly mode: the first non-finite tensor, named (forward in order, then the backward). Does
// nothing unless stats asks for it.
template <typename Real>
struct FiniteCheck {
  const ModelStats* stats = nullptr;
  void operator()(const Tensor<Real>& t, const std::string& what) const;
};

// Block li: x in, the block's input; out, its output. Keeps in A what the backward needs; adds
// the gate means, the selection histogram and the block's time and bytes into stats (if given).
template <typename Real>
void layer_forward_cpu(const ModelConfig& cfg, const LayerParams<Real>& L, const SeqLayout& layout,
                       size_t li, Tensor<Real>& x, LayerActivations<Real>& A, ModelStats* stats,
                       const FiniteCheck<Real>& check);

// Block li: dx in, the gradient of its output; out, of its input. Adds the block's parameter
// gradients into GL and its time into stats (if given).
template <typename Real>
void layer_backward_cpu(const ModelConfig& cfg, const LayerParams<Real>& L, LayerParams<Real>& GL,
                        const SeqLayout& layout, size_t li, LayerActivations<Real>& A,
                        Tensor<Real>& dx, ModelStats* stats, const FiniteCheck<Real>& check);

}  // namespace nsa
