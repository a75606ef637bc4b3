// Token embedding on the CPU (see embedding.h).
#include "embedding.h"

#include <algorithm>

#include "nsa/error.h"

namespace nsa::cpu {

template <typename Real>
void embedding_forward(const std::vector<int32_t>& tokens, const Tensor<Real>& table,
                       Tensor<Real>& y) {
  const int64_t T = static_cast<int64_t>(tokens.size()), V = table.dim(0), D = table.dim(1);
  y = Tensor<Real>({T, D});
  for (int64_t t = 0; t < T; ++t) {
    NSA_CHECK(tokens[t] >= 0 && tokens[t] < V, "token id ", tokens[t], " at position ", t,
              " is outside the vocabulary [0, ", V, ")");
    std::copy_n(table.ptr() + tokens[t] * D, D, y.ptr() + t * D);
  }
}

template <typename Real>
void embedding_backward(const std::vector<int32_t>& tokens, const Tensor<Real>& dy,
                        Tensor<Real>& dtable) {
  const int64_t D = dtable.dim(1);
  for (size_t t = 0; t < tokens.size(); ++t) {
    Real* row = dtable.ptr() + tokens[t] * D;
    for (int64_t i = 0; i < D; ++i) row[i] += dy[static_cast<int64_t>(t) * D + i];
  }
}

template void embedding_forward<float>(const std::vector<int32_t>&, const Tensor<float>&,
                                       Tensor<float>&);
template void embedding_forward<double>(const std::vector<int32_t>&, const Tensor<double>&,
                                        Tensor<double>&);
template void embedding_backward<float>(const std::vector<int32_t>&, const Tensor<float>&,
                                        Tensor<float>&);
template void embedding_backward<double>(const std::vector<int32_t>&, const Tensor<double>&,
                                         Tensor<double>&);

}  // namespace nsa::cpu
