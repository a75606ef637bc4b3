// Compression φ: raw (rotated) keys or values → one compressed token per block (docs/nsa.md,
// "Compressed branch").
//
// Compressed token i of a sequence summarises raw positions [i·d, i·d + l), per K/V group.
//   avg: y = (1/l) Σ_r x_r.
//   mlp: z = concat_r(x_r + pos_r) ∈ R^{l·D}, y = W2ᵀ silu(W1ᵀ z + b1) + b2. One MLP per tensor
//        kind (keys, values) shared by all groups. silu(u) = u·σ(u), silu'(u) = σ(u)(1 + u(1 −
//        σ(u))).
// Backward: avg spreads dy/l to each raw row of the block; mlp is the chain rule through the two
// layers, accumulating parameter gradients over every (sequence, block, group).
#pragma once

#include "nsa/attention.h"

namespace nsa {

namespace cpu {

// raw [T, G, D] → out [C, G, D] with C = Σ_n num_compressed(len_n). mlp == nullptr means avg.
template <typename Real>
void compress_forward(const NsaConfig& cfg, const SeqLayout& layout, const Tensor<Real>& raw,
                      const PhiMlpParams<Real>* mlp, Tensor<Real>& out);

// d_out [C, G, D] → d_raw [T, G, D] (+=) and, for mlp, d_mlp (+=, same shapes as mlp).
template <typename Real>
void compress_backward(const NsaConfig& cfg, const SeqLayout& layout, const Tensor<Real>& raw,
                       const PhiMlpParams<Real>* mlp, const Tensor<Real>& d_out,
                       Tensor<Real>& d_raw, PhiMlpParams<Real>* d_mlp);

}  // namespace cpu
}  // namespace nsa
