// RMSNorm on the CPU: y = x·r·w with r = (mean(x²) + eps)^-½ per row.
// Backward with x̂ = x·r and g = dy·w: dx = r·(g − x̂·mean(g·x̂)), dw = Σ_t dy·x̂.
#pragma once

#include "nsa/tensor.h"

namespace nsa::cpu {

// x [T, D], w [D] → y [T, D]; rstd [T] is kept for the backward.
template <typename Real>
void rmsnorm_forward(const Tensor<Real>& x, const Tensor<Real>& w, double eps, Tensor<Real>& y,
                     Tensor<Real>& rstd);
// dy [T, D] → dx [T, D] (overwritten), dw [D] (+=).
template <typename Real>
void rmsnorm_backward(const Tensor<Real>& x, const Tensor<Real>& w, const Tensor<Real>& rstd,
                      const Tensor<Real>& dy, Tensor<Real>& dx, Tensor<Real>& dw);

}  // namespace nsa::cpu
