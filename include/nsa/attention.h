// NSA attention at the tensor level: the CPU reference entry points (docs/nsa.md).
//
// Inputs are already projected and rotated (RoPE is the caller's business here): queries, K/V per
// branch (or one shared K/V), gate values in [0, 1], and the φ = mlp compressor's parameters. The
// token dimension T packs every sequence of a SeqLayout back to back. The reference runs in fp32
// (and in double for gradient checks), parallel over queries with OpenMP, and never holds anything
// of size S × S or S × S/d: every per-query buffer is O(S) and lives only for that query.
//
// The forward keeps what the backward and a CUDA port need: per-branch outputs and log-sum-exps,
// the compressed K/V, and the selected block indices (int32, ascending, −1 padded).
#pragma once

#include <cstdint>

#include "nsa/config.h"
#include "nsa/tensor.h"

namespace nsa {

// The φ = mlp parameters for one tensor kind with feature dim D and hidden width Hd
// (kPhiMlpTensors of them, in this order wherever they are listed).
constexpr int kPhiMlpTensors = 5;
template <typename Real>
struct PhiMlpParams {
  Tensor<Real> pos;  // [l, D]     intra-block position embedding
  Tensor<Real> w1;   // [l·D, Hd]
  Tensor<Real> b1;   // [Hd]
  Tensor<Real> w2;   // [Hd, D]
  Tensor<Real> b2;   // [D]
};

// The inputs of one NSA attention call, and (same shapes) their gradients.
template <typename Real>
struct NsaTensors {
  Tensor<Real> q;                   // [T, H, dk]
  Tensor<Real> k[kNumBranches];     // [T, G, dk]; kv = shared: only k[0] is used
  Tensor<Real> v[kNumBranches];     // [T, G, dv]; kv = shared: only v[0] is used
  Tensor<Real> gate[kNumBranches];  // [T, H], gate values (after sigmoid/softmax)
  PhiMlpParams<Real> phi_k;         // φ = mlp only, D = dk
  PhiMlpParams<Real> phi_v;         // φ = mlp only, D = dv
};

template <typename Real>
struct NsaForward {
  Tensor<Real> o;                       // [T, H, dv] = Σ_c gate_c · o_c
  Tensor<Real> o_branch[kNumBranches];  // [T, H, dv]
  Tensor<Real> lse[kNumBranches];       // [T, H]; cmp is -inf where nothing is visible
  Tensor<Real> k_cmp;                   // [C, G, dk] compressed keys (C over all sequences)
  Tensor<Real> v_cmp;                   // [C, G, dv] compressed values
  Tensor<int32_t> sel_idx;              // [T, G, n_sel], ascending, −1 padded
};

// Checks every tensor's presence and shape against the config and layout; throws nsa::Error
// naming the tensor.
template <typename Real>
void check_inputs(const NsaConfig& cfg, const SeqLayout& layout, const NsaTensors<Real>& in);

// Zero tensors with the shapes of the used inputs (the gradient accumulator of the backward).
template <typename Real>
NsaTensors<Real> zeros_like_inputs(const NsaConfig& cfg, const NsaTensors<Real>& in);

// `selection` (optional, [T, G, n_sel]) replaces the top-n choice with given sets – used to compare
// another backend's outputs on the sets it chose. Each set must be ascending, −1 padded, within
// 0..c and contain c (the current block); otherwise nsa::Error.
template <typename Real>
NsaForward<Real> nsa_forward_cpu(const NsaConfig& cfg, const SeqLayout& layout,
                                 const NsaTensors<Real>& in,
                                 const Tensor<int32_t>* selection = nullptr);

// d_o [T, H, dv] → gradients of every used input. Uses the forward's saved selection.
template <typename Real>
NsaTensors<Real> nsa_backward_cpu(const NsaConfig& cfg, const SeqLayout& layout,
                                  const NsaTensors<Real>& in, const NsaForward<Real>& fwd,
                                  const Tensor<Real>& d_o);

// Random inputs for tests, benchmarks and examples: q, k, v ~ N(0, 1), gates = sigmoid(N(0, 1)),
// φ = mlp parameters at a standard initialisation (all reproducible from `seed`).
template <typename Real>
NsaTensors<Real> random_nsa_inputs(const NsaConfig& cfg, int64_t total_tokens, uint64_t seed);

// Gate activation: logits [T, H] per branch → values (sigmoid each, or softmax over branches).
template <typename Real>
void gate_activation_forward(GateActivation act, const Tensor<Real> (&logits)[kNumBranches],
                             Tensor<Real> (&values)[kNumBranches]);
// d_values → d_logits (overwritten), from the forward's values.
template <typename Real>
void gate_activation_backward(GateActivation act, const Tensor<Real> (&values)[kNumBranches],
                              const Tensor<Real> (&d_values)[kNumBranches],
                              Tensor<Real> (&d_logits)[kNumBranches]);

}  // namespace nsa
