// Gate logits → gate values, forward and backward (docs/nsa.md, "Gates and output").
//
// sigmoid (default, the paper's): g_c = σ(z_c), dz_c = dg_c · g_c (1 − g_c).
// softmax over the three branches of each (token, head): dz_c = g_c (dg_c − Σ_b g_b dg_b).
#include <algorithm>
#include <cmath>

#include "nsa/attention.h"

namespace nsa {

template <typename Real>
void gate_activation_forward(GateActivation act, const Tensor<Real> (&logits)[kNumBranches],
                             Tensor<Real> (&values)[kNumBranches]) {
  for (int c = 1; c < kNumBranches; ++c) check_shape(logits[c], logits[0].shape, "gate logits");
  for (int c = 0; c < kNumBranches; ++c) values[c] = Tensor<Real>(logits[0].shape);
  const int64_t n = logits[0].numel();
  for (int64_t i = 0; i < n; ++i) {
    if (act == GateActivation::kSigmoid) {
      for (int c = 0; c < kNumBranches; ++c) values[c][i] = 1 / (1 + std::exp(-logits[c][i]));
      continue;
    }
    Real m = logits[0][i];
    for (int c = 1; c < kNumBranches; ++c) m = std::max(m, logits[c][i]);
    Real sum = 0;
    for (int c = 0; c < kNumBranches; ++c) sum += (values[c][i] = std::exp(logits[c][i] - m));
    for (int c = 0; c < kNumBranches; ++c) values[c][i] /= sum;
  }
}

template <typename Real>
void gate_activation_backward(GateActivation act, const Tensor<Real> (&values)[kNumBranches],
                              const Tensor<Real> (&d_values)[kNumBranches],
                              Tensor<Real> (&d_logits)[kNumBranches]) {
  for (int c = 0; c < kNumBranches; ++c) d_logits[c] = Tensor<Real>(values[0].shape);
  const int64_t n = values[0].numel();
  for (int64_t i = 0; i < n; ++i) {
    if (act == GateActivation::kSigmoid) {
      for (int c = 0; c < kNumBranches; ++c) {
        d_logits[c][i] = d_values[c][i] * values[c][i] * (1 - values[c][i]);
      }
      continue;
    }
    Real dot = 0;
    for (int c = 0; c < kNumBranches; ++c) dot += values[c][i] * d_values[c][i];
    for (int c = 0; c < kNumBranches; ++c) d_logits[c][i] = values[c][i] * (d_values[c][i] - dot);
  }
}

#define NSA_INSTANTIATE(Real)                                                            \
  template void gate_activation_forward<Real>(GateActivation, const Tensor<Real>(&)[3],  \
                                              Tensor<Real>(&)[3]);                       \
  template void gate_activation_backward<Real>(GateActivation, const Tensor<Real>(&)[3], \
                                               const Tensor<Real>(&)[3], Tensor<Real>(&)[3]);
NSA_INSTANTIATE(float)
NSA_INSTANTIATE(double)
#undef NSA_INSTANTIATE

}  // namespace nsa
