// Rotary position embedding on the CPU (see rope.h).
#include "rope.h"

#include <cmath>

#include "nsa/error.h"

namespace nsa::cpu {

template <typename Real>
void rope_apply(Tensor<Real>& x, const SeqLayout& layout, double base, bool inverse,
                int64_t first_position) {
  const int64_t heads = x.dim(1), D = x.dim(2);
  NSA_CHECK(D % 2 == 0, "RoPE needs an even head dim, got ", D);
  for (int64_t n = 0; n < layout.num_seqs(); ++n) {
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < layout.length(n); ++t) {
      Real* row = x.ptr() + (layout.start(n) + t) * heads * D;
      for (int64_t i = 0; i < D / 2; ++i) {
        const double theta = static_cast<double>(first_position + t) *
                             std::pow(base, -2.0 * static_cast<double>(i) / D);
        const Real c = static_cast<Real>(std::cos(theta));
        const Real s = static_cast<Real>(inverse ? -std::sin(theta) : std::sin(theta));
        for (int64_t h = 0; h < heads; ++h) {
          Real* p = row + h * D + 2 * i;
          const Real a = p[0], b = p[1];
          p[0] = a * c - b * s;
          p[1] = a * s + b * c;
        }
      }
    }
  }
}

template void rope_apply<float>(Tensor<float>&, const SeqLayout&, double, bool, int64_t);
template void rope_apply<double>(Tensor<double>&, const SeqLayout&, double, bool, int64_t);

}  // namespace nsa::cpu
