// Block scores and top-n selection on the CPU (see block_select.h).
#include "block_select.h"

#include <algorithm>

namespace nsa::cpu {

template <typename Real>
void accumulate_block_scores(const NsaConfig& cfg, const Real* p_cmp, int64_t n_visible,
                             Real* block_scores) {
  const Real inv_l = Real(1) / static_cast<Real>(cfg.l);
  for (int64_t i = 0; i < n_visible; ++i) {
    const int64_t lo = i * cfg.d, hi = i * cfg.d + cfg.l;  // raw positions [lo, hi)
    for (int64_t j = lo / cfg.l_sel; j * cfg.l_sel < hi; ++j) {
      const int64_t overlap = std::min(hi, (j + 1) * cfg.l_sel) - std::max(lo, j * cfg.l_sel);
      block_scores[j] += p_cmp[i] * static_cast<Real>(overlap) * inv_l;
    }
  }
}

template <typename Real>
int64_t select_blocks(const Real* scores, int64_t t, int64_t l_sel, int64_t n_sel, int32_t* out) {
  const int64_t c = t / l_sel;
  int64_t n = 0;
  // Forced blocks, ascending and distinct: 0, c−1, c.
  out[n++] = 0;
  if (c - 1 > 0) out[n++] = static_cast<int32_t>(c - 1);
  if (c > 0) out[n++] = static_cast<int32_t>(c);
  const int64_t n_forced = n;
  // Candidates are the complete blocks that are not forced: 1 .. c−2. Keep the best
  // n_sel − n_forced in out[n_forced..] ordered by (score desc, index asc) via insertion; scanning
  // indices ascending and moving an entry only past strictly lower scores realises the tie rule.
  for (int64_t j = 1; j <= c - 2 && n_sel > n_forced; ++j) {
    const Real s = scores[j];
    if (n == n_sel && !(s > scores[out[n - 1]])) continue;
    int64_t pos = (n < n_sel) ? n++ : n - 1;
    while (pos > n_forced && s > scores[out[pos - 1]]) {
      out[pos] = out[pos - 1];
      --pos;
    }
    out[pos] = static_cast<int32_t>(j);
  }
  std::sort(out, out + n);
  for (int64_t k = n; k < n_sel; ++k) out[k] = -1;
  return n;
}

#define NSA_INSTANTIATE(Real)                                                                 \
  template void accumulate_block_scores<Real>(const NsaConfig&, const Real*, int64_t, Real*); \
  template int64_t select_blocks<Real>(const Real*, int64_t, int64_t, int64_t, int32_t*);
NSA_INSTANTIATE(float)
NSA_INSTANTIATE(double)
#undef NSA_INSTANTIATE

}  // namespace nsa::cpu
