// Mean cross-entropy over tokens on the CPU, from logits.
// loss = mean_t (logsumexp(z_t) − z_t[y_t]);  dz = (softmax(z) − onehot(y)) / T.
#pragma once

#include <cstdint>
#include <vector>

#include "nsa/tensor.h"

namespace nsa::cpu {

// logits [T, V], targets [T] (each in [0, V)) → mean loss in double; dlogits [T, V] when non-null;
// row_losses [T] (each row's loss, the terms of the mean) when non-null.
template <typename Real>
double cross_entropy(const Tensor<Real>& logits, const std::vector<int32_t>& targets,
                     Tensor<Real>* dlogits, std::vector<double>* row_losses = nullptr);

}  // namespace nsa::cpu
