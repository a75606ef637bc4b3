// Rotary position embedding on the CPU, applied before attention (docs/nsa.md, "Inputs at the
// attention level": keys arrive rotated). Standard per-head rotation, position = token index
// within its sequence. Pairs (2i, 2i+1) of each head vector of dim D rotate by
// θ = pos·base^(−2i/D). The map is orthogonal, so the backward is the inverse rotation.
#pragma once

#include "nsa/config.h"
#include "nsa/tensor.h"

namespace nsa::cpu {

// In place on x [T, heads, D] (D even). inverse = true rotates by −θ (the backward). Positions
// are first_position + (index within the sequence): decoding passes the cache length.
template <typename Real>
void rope_apply(Tensor<Real>& x, const SeqLayout& layout, double base, bool inverse,
                int64_t first_position = 0);

}  // namespace nsa::cpu
