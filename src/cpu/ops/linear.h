// Linear layer on the CPU: y = x·Wᵀ + b, W stored [out, in] as in PyTorch/Llama checkpoints.
// Backward: dx = dy·W, dW = dyᵀ·x, db = Σ_t dy.
#pragma once

#include <type_traits>

#include "nsa/tensor.h"

namespace nsa::cpu {

// x [T, in], w [out, in], b [out] or nullptr → y [T, out].
template <typename Real>
void linear_forward(const Tensor<Real>& x, const Tensor<Real>& w,
                    const std::type_identity_t<Tensor<Real>>* b, Tensor<Real>& y);
// dy [T, out] → dx [T, in] (+= when accumulate_dx), dw [out, in] (+=), db [out] (+=, optional).
template <typename Real>
void linear_backward(const Tensor<Real>& x, const Tensor<Real>& w, const Tensor<Real>& dy,
                     Tensor<Real>& dx, bool accumulate_dx, Tensor<Real>& dw,
                     std::type_identity_t<Tensor<Real>>* db);

}  // namespace nsa::cpu
