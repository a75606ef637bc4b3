// Elementwise MLP activations on the CPU.
// swiglu: y = silu(a)·b.  da = dy·b·silu'(a), db = dy·silu(a).
// silu:   y = silu(a).    da = dy·silu'(a).      silu(a) = a·σ(a), silu' = σ(1 + a(1 − σ)).
#pragma once

#include "nsa/tensor.h"

namespace nsa::cpu {

template <typename Real>
void swiglu_forward(const Tensor<Real>& a, const Tensor<Real>& b, Tensor<Real>& y);
template <typename Real>
void swiglu_backward(const Tensor<Real>& a, const Tensor<Real>& b, const Tensor<Real>& dy,
                     Tensor<Real>& da, Tensor<Real>& db);
template <typename Real>
void silu_forward(const Tensor<Real>& a, Tensor<Real>& y);
template <typename Real>
void silu_backward(const Tensor<Real>& a, const Tensor<Real>& dy, Tensor<Real>& da);

}  // namespace nsa::cpu
