// CPU softmax attention over key ranges, forward and backward (see attend_row.h).
#include "attend_row.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace nsa::cpu {
namespace {

template <typename Real>
Real dot(const Real* a, const Real* b, int64_t n) {
  Real s = 0;
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

}  // namespace

template <typename Real>
Real attend_row_forward(const Real* q, const RowKv<Real>& kv, const KeyRange* ranges, int n_ranges,
                        int64_t dk, int64_t dv, Real scale, Real* out, Real* probs) {
  std::fill(out, out + dv, Real(0));
  Real max_score = -std::numeric_limits<Real>::infinity();
  int64_t n = 0;
  for (int r = 0; r < n_ranges; ++r) {
    for (int64_t j = ranges[r].begin; j < ranges[r].end; ++j, ++n) {
      probs[n] = scale * dot(q, kv.k + j * kv.k_stride, dk);
      max_score = std::max(max_score, probs[n]);
    }
  }
  if (n == 0) return -std::numeric_limits<Real>::infinity();
  Real sum = 0;
  for (int64_t j = 0; j < n; ++j) {
    probs[j] = std::exp(probs[j] - max_score);
    sum += probs[j];
  }
  const Real inv_sum = Real(1) / sum;
  n = 0;
  for (int r = 0; r < n_ranges; ++r) {
    for (int64_t j = ranges[r].begin; j < ranges[r].end; ++j, ++n) {
      probs[n] *= inv_sum;
      const Real* v = kv.v + j * kv.v_stride;
      for (int64_t c = 0; c < dv; ++c) out[c] += probs[n] * v[c];
    }
  }
  return max_score + std::log(sum);
}

template <typename Real>
void attend_row_backward(const Real* q, const RowKv<Real>& kv, const KeyRange* ranges, int n_ranges,
                         int64_t dk, int64_t dv, Real scale, Real lse, const Real* out,
                         const Real* d_out, Real* dq, Real* dk_rows, Real* dv_rows) {
  if (!std::isfinite(lse)) return;  // no keys: the branch output is the constant 0
  const Real D = dot(d_out, out, dv);
  for (int r = 0; r < n_ranges; ++r) {
    for (int64_t j = ranges[r].begin; j < ranges[r].end; ++j) {
      const Real* k = kv.k + j * kv.k_stride;
      const Real* v = kv.v + j * kv.v_stride;
      const Real p = std::exp(scale * dot(q, k, dk) - lse);
      const Real ds = p * (dot(d_out, v, dv) - D);
      Real* dkj = dk_rows + j * kv.k_stride;
      Real* dvj = dv_rows + j * kv.v_stride;
      for (int64_t c = 0; c < dv; ++c) dvj[c] += p * d_out[c];
      for (int64_t c = 0; c < dk; ++c) {
        dq[c] += scale * ds * k[c];
        dkj[c] += scale * ds * q[c];
      }
    }
  }
}

#define NSA_INSTANTIATE(Real)                                                                     \
  template Real attend_row_forward<Real>(const Real*, const RowKv<Real>&, const KeyRange*, int,   \
                                         int64_t, int64_t, Real, Real*, Real*);                   \
  template void attend_row_backward<Real>(const Real*, const RowKv<Real>&, const KeyRange*, int,  \
                                          int64_t, int64_t, Real, Real, const Real*, const Real*, \
                                          Real*, Real*, Real*);
NSA_INSTANTIATE(float)
NSA_INSTANTIATE(double)
#undef NSA_INSTANTIATE

}  // namespace nsa::cpu
