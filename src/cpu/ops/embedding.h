// Token embedding on the CPU: y[t] = E[tok[t]]. Backward: dE[tok[t]] += dy[t], in token order
// (deterministic).
#pragma once

#include <cstdint>
#include <vector>

#include "nsa/tensor.h"

namespace nsa::cpu {

// tokens [T] (each in [0, vocab), else nsa::Error naming the position), table [vocab, D] → y [T,
// D].
template <typename Real>
void embedding_forward(const std::vector<int32_t>& tokens, const Tensor<Real>& table,
                       Tensor<Real>& y);
// dy [T, D] → dtable (+=).
template <typename Real>
void embedding_backward(const std::vector<int32_t>& tokens, const Tensor<Real>& dy,
                        Tensor<Real>& dtable);

}  // namespace nsa::cpu
