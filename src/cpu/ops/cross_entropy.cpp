// Cross-entropy on the CPU (see cross_entropy.h). Per-row losses are summed in row order.
#include "cross_entropy.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "nsa/error.h"

namespace nsa::cpu {

template <typename Real>
double cross_entropy(const Tensor<Real>& logits, const std::vector<int32_t>& targets,
                     Tensor<Real>* dlogits, std::vector<double>* row_losses) {
  const int64_t T = logits.dim(0), V = logits.dim(1);
  NSA_CHECK(static_cast<int64_t>(targets.size()) == T, "cross_entropy: ", targets.size(),
            " targets for ", T, " rows of logits");
  for (int64_t t = 0; t < T; ++t) {
    NSA_CHECK(targets[t] >= 0 && targets[t] < V, "target id ", targets[t], " at position ", t,
              " is outside the vocabulary [0, ", V, ")");
  }
  if (dlogits) *dlogits = Tensor<Real>({T, V});
  std::vector<double> row_loss(static_cast<size_t>(T));
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < T; ++t) {
    const Real* z = logits.ptr() + t * V;
    const Real m = *std::max_element(z, z + V);
    double sum = 0;
    for (int64_t v = 0; v < V; ++v) sum += std::exp(static_cast<double>(z[v] - m));
    const double lse = static_cast<double>(m) + std::log(sum);
    row_loss[t] = lse - static_cast<double>(z[targets[t]]);
    if (dlogits) {
      Real* dz = dlogits->ptr() + t * V;
      for (int64_t v = 0; v < V; ++v) {
        dz[v] =
            static_cast<Real>(std::exp(static_cast<double>(z[v]) - lse) / static_cast<double>(T));
      }
      dz[targets[t]] -= static_cast<Real>(1.0 / static_cast<double>(T));
    }
  }
  double loss = 0;
  for (int64_t t = 0; t < T; ++t) loss += row_loss[t];
  if (row_losses) *row_losses = std::move(row_loss);
  return loss / static_cast<double>(T);
}

template double cross_entropy<float>(const Tensor<float>&, const std::vector<int32_t>&,
                                     Tensor<float>*, std::vector<double>*);
template double cross_entropy<double>(const Tensor<double>&, const std::vector<int32_t>&,
                                      Tensor<double>*, std::vector<double>*);

}  // namespace nsa::cpu
