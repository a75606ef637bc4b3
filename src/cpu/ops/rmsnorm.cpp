// RMSNorm on the CPU (see rmsnorm.h).
#include "rmsnorm.h"

#include <cmath>

namespace nsa::cpu {

template <typename Real>
void rmsnorm_forward(const Tensor<Real>& x, const Tensor<Real>& w, double eps, Tensor<Real>& y,
                     Tensor<Real>& rstd) {
  const int64_t T = x.dim(0), D = x.dim(1);
  check_shape(w, {D}, "rmsnorm weight");
  y = Tensor<Real>({T, D});
  rstd = Tensor<Real>({T});
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < T; ++t) {
    const Real* xr = x.ptr() + t * D;
    Real ms = 0;
    for (int64_t i = 0; i < D; ++i) ms += xr[i] * xr[i];
    const Real r = Real(1) / std::sqrt(ms / static_cast<Real>(D) + static_cast<Real>(eps));
    rstd[t] = r;
    for (int64_t i = 0; i < D; ++i) y[t * D + i] = xr[i] * r * w[i];
  }
}

template <typename Real>
void rmsnorm_backward(const Tensor<Real>& x, const Tensor<Real>& w, const Tensor<Real>& rstd,
                      const Tensor<Real>& dy, Tensor<Real>& dx, Tensor<Real>& dw) {
  const int64_t T = x.dim(0), D = x.dim(1);
  dx = Tensor<Real>({T, D});
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < T; ++t) {
    const Real r = rstd[t];
    Real dot = 0;
    for (int64_t i = 0; i < D; ++i) dot += dy[t * D + i] * w[i] * x[t * D + i] * r;
    dot /= static_cast<Real>(D);
    for (int64_t i = 0; i < D; ++i) {
      const Real xhat = x[t * D + i] * r;
      dx[t * D + i] = r * (dy[t * D + i] * w[i] - xhat * dot);
    }
  }
  for (int64_t t = 0; t < T; ++t) {  // sequential over rows: a fixed summation order
    for (int64_t i = 0; i < D; ++i) dw[i] += dy[t * D + i] * x[t * D + i] * rstd[t];
  }
}

template void rmsnorm_forward<float>(const Tensor<float>&, const Tensor<float>&, double,
                                     Tensor<float>&, Tensor<float>&);
template void rmsnorm_forward<double>(const Tensor<double>&, const Tensor<double>&, double,
                                      Tensor<double>&, Tensor<double>&);
template void rmsnorm_backward<float>(const Tensor<float>&, const Tensor<float>&,
                                      const Tensor<float>&, const Tensor<float>&, Tensor<float>&,
                                      Tensor<float>&);
template void rmsnorm_backward<double>(const Tensor<double>&, const Tensor<double>&,
                                       const Tensor<double>&, const Tensor<double>&,
                                       Tensor<double>&, Tensor<double>&);

}  // namespace nsa::cpu
