// MLP activations on the CPU (see activations.h).
#include "activations.h"

#include <cmath>

namespace nsa::cpu {
namespace {

template <typename Real>
Real sigmoid(Real x) {
  return Real(1) / (Real(1) + std::exp(-x));
}

}  // namespace

template <typename Real>
void swiglu_forward(const Tensor<Real>& a, const Tensor<Real>& b, Tensor<Real>& y) {
  check_shape(b, a.shape, "swiglu gate input");
  y = Tensor<Real>(a.shape);
  for (int64_t i = 0; i < a.numel(); ++i) y[i] = a[i] * sigmoid(a[i]) * b[i];
}

template <typename Real>
void swiglu_backward(const Tensor<Real>& a, const Tensor<Real>& b, const Tensor<Real>& dy,
                     Tensor<Real>& da, Tensor<Real>& db) {
  da = Tensor<Real>(a.shape);
  db = Tensor<Real>(a.shape);
  for (int64_t i = 0; i < a.numel(); ++i) {
    const Real s = sigmoid(a[i]);
    da[i] = dy[i] * b[i] * s * (Real(1) + a[i] * (Real(1) - s));
    db[i] = dy[i] * a[i] * s;
  }
}

template <typename Real>
void silu_forward(const Tensor<Real>& a, Tensor<Real>& y) {
  y = Tensor<Real>(a.shape);
  for (int64_t i = 0; i < a.numel(); ++i) y[i] = a[i] * sigmoid(a[i]);
}

template <typename Real>
void silu_backward(const Tensor<Real>& a, const Tensor<Real>& dy, Tensor<Real>& da) {
  da = Tensor<Real>(a.shape);
  for (int64_t i = 0; i < a.numel(); ++i) {
    const Real s = sigmoid(a[i]);
    da[i] = dy[i] * s * (Real(1) + a[i] * (Real(1) - s));
  }
}

#define NSA_INSTANTIATE(Real)                                                                  \
  template void swiglu_forward<Real>(const Tensor<Real>&, const Tensor<Real>&, Tensor<Real>&); \
  template void swiglu_backward<Real>(const Tensor<Real>&, const Tensor<Real>&,                \
                                      const Tensor<Real>&, Tensor<Real>&, Tensor<Real>&);      \
  template void silu_forward<Real>(const Tensor<Real>&, Tensor<Real>&);                        \
  template void silu_backward<Real>(const Tensor<Real>&, const Tensor<Real>&, Tensor<Real>&);
NSA_INSTANTIATE(float)
NSA_INSTANTIATE(double)
#undef NSA_INSTANTIATE

}  // namespace nsa::cpu
