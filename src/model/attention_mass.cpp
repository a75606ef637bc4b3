// attention_mass.h: p_j = exp(scale · q·k_j − lse) of the branch, summed over the span's keys
// (compressed tokens) that the branch attends (docs/nsa.md's three branches).
#include "attention_mass.h"

#include <algorithm>
#include <cmath>

#include "nsa/error.h"

namespace nsa {

template <typename Real>
std::vector<float> attention_mass(const NsaConfig& cfg, const SeqLayout& layout,
                                  const NsaTensors<Real>& in, const NsaForward<Real>& fwd,
                                  const std::vector<MassQuery>& queries) {
  const int64_t H = cfg.heads, G = cfg.groups, hpg = H / G, dk = cfg.dk, n_sel = cfg.n_sel;
  const Real scale = static_cast<Real>(cfg.softmax_scale());
  const Tensor<Real>& k_sel = in.k[cfg.kv_index(kSel)];
  const Tensor<Real>& k_win = in.k[cfg.kv_index(kWin)];
  const std::vector<int64_t> cmp_offset = layout.compressed_offsets(cfg);
  std::vector<float> out(queries.size() * static_cast<size_t>(H) * kNumBranches, 0.0f);
  for (size_t i = 0; i < queries.size(); ++i) {
    const MassQuery& m = queries[i];
    NSA_CHECK(m.row >= 0 && m.row < layout.total_tokens(), "attention mass: query ", i, "'s row ",
              m.row, " is outside the layout's ", layout.total_tokens(), " tokens");
    const auto seq = std::upper_bound(layout.cu_seqlens.begin(), layout.cu_seqlens.end(), m.row) -
                     layout.cu_seqlens.begin() - 1;
    const int64_t start = layout.start(seq), t = m.row - start;
    NSA_CHECK(m.begin >= start && m.begin <= m.end && m.end <= start + layout.length(seq),
              "attention mass: query ", i, "'s keys [", m.begin, ", ", m.end,
              ") are not within its sequence [", start, ", ", start + layout.length(seq), ")");
    for (int64_t h = 0; h < H; ++h) {
      const int64_t g = h / hpg, th = m.row * H + h;
      const Real* q = in.q.ptr() + th * dk;
      const int32_t* sel = fwd.sel_idx.ptr() + (m.row * G + g) * n_sel;
      const auto p = [&](const Tensor<Real>& k, int64_t j, Real lse) {
        const Real* kj = k.ptr() + (j * G + g) * dk;
        Real s = 0;
        for (int64_t e = 0; e < dk; ++e) s += q[e] * kj[e];
        return static_cast<double>(std::exp(scale * s - lse));
      };
      double mass[kNumBranches] = {0, 0, 0};
      // Compressed token i covers tokens [i·d, i·d + l) of the sequence; visible: i·d + l ≤ t + 1.
      const int64_t first = m.begin - start, last = m.end - start - 1;
      for (int64_t i = 0; first <= last && i < cfg.num_visible_compressed(t); ++i) {
        if (i * cfg.d + cfg.l - 1 < first || i * cfg.d > last) continue;
        mass[kCmp] += p(fwd.k_cmp, cmp_offset[seq] + i, fwd.lse[kCmp][th]);
      }
      for (int64_t j = m.begin; j < m.end; ++j) {
        const int64_t tj = j - start;
        if (tj > t) break;
        const int64_t block = tj / cfg.l_sel;
        if (std::find(sel, sel + n_sel, static_cast<int32_t>(block)) != sel + n_sel)
          mass[kSel] += p(k_sel, j, fwd.lse[kSel][th]);
        if (tj > t - cfg.w) mass[kWin] += p(k_win, j, fwd.lse[kWin][th]);
      }
      for (int c = 0; c < kNumBranches; ++c)
        out[(i * H + h) * kNumBranches + c] = static_cast<float>(mass[c]);
    }
  }
  return out;
}

template std::vector<float> attention_mass(const NsaConfig&, const SeqLayout&,
                                           const NsaTensors<float>&, const NsaForward<float>&,
                                           const std::vector<MassQuery>&);
template std::vector<float> attention_mass(const NsaConfig&, const SeqLayout&,
                                           const NsaTensors<double>&, const NsaForward<double>&,
                                           const std::vector<MassQuery>&);

}  // namespace nsa
