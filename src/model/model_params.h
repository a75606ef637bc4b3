// The parameters of the NSA language model, with their Llama-style checkpoint names.
//
// Names: tok_embeddings.weight; layers.{i}.attention_norm.weight; layers.{i}.attention.wq.weight,
// .wk_cmp/.wk_sel/.wk_win (or .wk when kv = shared), .wv_*, .wg.weight/.wg.bias (gates, rows
// ordered head-major: row h·3 + c for branch c), .wo.weight, .phi_k.{pos,w1,b1,w2,b2} and
// .phi_v.* (φ = mlp); layers.{i}.ffn_norm.weight; layers.{i}.feed_forward.w1/w2/w3.weight (w3 only
// for SwiGLU); norm.weight; output.weight (untied only). Weights are [out, in].
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "nsa/attention.h"
#include "nsa/model_config.h"

namespace nsa {

template <typename Real>
struct LayerParams {
  Tensor<Real> attn_norm;           // [dim]
  Tensor<Real> wq;                  // [H·dk, dim]
  Tensor<Real> wk[kNumBranches];    // [G·dk, dim]; kv = shared: only [0]
  Tensor<Real> wv[kNumBranches];    // [G·dv, dim]
  Tensor<Real> wg, bg;              // [3H, dim], [3H]
  Tensor<Real> wo;                  // [dim, H·dv]
  PhiMlpParams<Real> phi_k, phi_v;  // φ = mlp only
  Tensor<Real> ffn_norm;            // [dim]
  Tensor<Real> w1, w2, w3;          // [F, dim], [dim, F], [F, dim] (w3: SwiGLU only)
};

template <typename Real>
struct ModelParams {
  Tensor<Real> tok_emb;  // [vocab, dim]
  std::vector<LayerParams<Real>> layers;
  Tensor<Real> norm;    // [dim]
  Tensor<Real> output;  // [vocab, dim], untied only

  // Every parameter with its checkpoint name, in a fixed order.
  std::vector<std::pair<std::string, Tensor<Real>*>> named(const ModelConfig& cfg);
};

// Llama/GPT-2 practice: N(0, init_std) for matrices, residual projections (wo, w2) scaled by
// 1/sqrt(2·n_layers), norms 1, gate bias 0 (gates start at 0.5); reproducible from cfg.seed.
template <typename Real>
ModelParams<Real> init_model_params(const ModelConfig& cfg);
// Same shapes, all zero (gradient accumulators).
template <typename Real>
ModelParams<Real> zeros_like(const ModelConfig& cfg, ModelParams<Real>& params);

}  // namespace nsa
