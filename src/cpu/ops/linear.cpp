// Linear layer on the CPU (see linear.h). Rows of x are independent in the forward and in dx;
// dW rows (one per output feature) are independent in the backward: OpenMP over those. Every
// element is summed in a fixed order (inputs ascending, or rows ascending for dW).
#include "linear.h"

namespace nsa::cpu {

template <typename Real>
void linear_forward(const Tensor<Real>& x, const Tensor<Real>& w,
                    const std::type_identity_t<Tensor<Real>>* b, Tensor<Real>& y) {
  const int64_t T = x.dim(0), in = x.dim(1), out = w.dim(0);
  check_shape(w, {out, in}, "linear weight");
  // Wᵀ once, so each output row is a sum of scaled rows of Wᵀ: axpy loops the compiler
  // vectorises, where a dot product (a strict-order reduction) would stay scalar.
  Tensor<Real> wt({in, out});
  for (int64_t o = 0; o < out; ++o) {
    for (int64_t i = 0; i < in; ++i) wt[i * out + o] = w[o * in + i];
  }
  y = Tensor<Real>({T, out});
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < T; ++t) {
    const Real* xr = x.ptr() + t * in;
    Real* yr = y.ptr() + t * out;
    for (int64_t o = 0; o < out; ++o) yr[o] = b ? (*b)[o] : Real(0);
    for (int64_t i = 0; i < in; ++i) {
      const Real xi = xr[i];
      const Real* wr = wt.ptr() + i * out;
      for (int64_t o = 0; o < out; ++o) yr[o] += xi * wr[o];
    }
  }
}

template <typename Real>
void linear_backward(const Tensor<Real>& x, const Tensor<Real>& w, const Tensor<Real>& dy,
                     Tensor<Real>& dx, bool accumulate_dx, Tensor<Real>& dw,
                     std::type_identity_t<Tensor<Real>>* db) {
  const int64_t T = x.dim(0), in = x.dim(1), out = w.dim(0);
  if (!accumulate_dx) dx = Tensor<Real>({T, in});
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < T; ++t) {
    Real* dxr = dx.ptr() + t * in;
    for (int64_t o = 0; o < out; ++o) {
      const Real g = dy[t * out + o];
      const Real* wr = w.ptr() + o * in;
      for (int64_t i = 0; i < in; ++i) dxr[i] += g * wr[i];
    }
  }
#pragma omp parallel for schedule(static)
  for (int64_t o = 0; o < out; ++o) {
    Real* dwr = dw.ptr() + o * in;
    Real dbo = 0;
    for (int64_t t = 0; t < T; ++t) {
      const Real g = dy[t * out + o];
      const Real* xr = x.ptr() + t * in;
      for (int64_t i = 0; i < in; ++i) dwr[i] += g * xr[i];
      dbo += g;
    }
    if (db) (*db)[o] += dbo;
  }
}

template void linear_forward<float>(const Tensor<float>&, const Tensor<float>&,
                                    const Tensor<float>*, Tensor<float>&);
template void linear_forward<double>(const Tensor<double>&, const Tensor<double>&,
                                     const Tensor<double>*, Tensor<double>&);
template void linear_backward<float>(const Tensor<float>&, const Tensor<float>&,
                                     const Tensor<float>&, Tensor<float>&, bool, Tensor<float>&,
                                     Tensor<float>*);
template void linear_backward<double>(const Tensor<double>&, const Tensor<double>&,
                                      const Tensor<double>&, Tensor<double>&, bool, Tensor<double>&,
                                      Tensor<double>*);

}  // namespace nsa::cpu
