// Brute-force NSA oracle (see nsa_oracle.h). Deliberately naive: masks, dense matrices, scans.
#include "nsa_oracle.h"

#include <algorithm>
#include <cmath>
#include <set>

namespace nsa::test {
namespace {

using Matrix = std::vector<std::vector<double>>;

// Masked softmax attention of one query row over all S positions of a sequence.
std::vector<double> masked_attention(const double* q, const std::vector<const double*>& keys,
                                     const std::vector<const double*>& values,
                                     const std::vector<bool>& mask, int64_t dk, int64_t dv,
                                     double scale, std::vector<double>* probs_out = nullptr) {
  const size_t n = keys.size();
  std::vector<double> s(n, -INFINITY), p(n, 0.0), o(dv, 0.0);
  double m = -INFINITY;
  for (size_t j = 0; j < n; ++j) {
    if (!mask[j]) continue;
    double dot = 0;
    for (int64_t c = 0; c < dk; ++c) dot += q[c] * keys[j][c];
    s[j] = scale * dot;
    m = std::max(m, s[j]);
  }
  if (m != -INFINITY) {
    double z = 0;
    for (size_t j = 0; j < n; ++j) z += mask[j] ? std::exp(s[j] - m) : 0.0;
    for (size_t j = 0; j < n; ++j) p[j] = mask[j] ? std::exp(s[j] - m) / z : 0.0;
    for (size_t j = 0; j < n; ++j) {
      for (int64_t c = 0; c < dv; ++c) o[c] += p[j] * values[j][c];
    }
  }
  if (probs_out) *probs_out = p;
  return o;
}

// φ applied to one block: rows x_0..x_{l-1} of dim D.
std::vector<double> compress_block(const NsaConfig& cfg, const std::vector<const double*>& rows,
                                   const PhiMlpParams<double>& mlp, int64_t D) {
  std::vector<double> y(D, 0.0);
  if (cfg.phi == Phi::kAvg) {
    for (const double* x : rows) {
      for (int64_t c = 0; c < D; ++c) y[c] += x[c] / static_cast<double>(cfg.l);
    }
    return y;
  }
  const int64_t hid = mlp.b1.numel();
  std::vector<double> z;
  for (int64_t r = 0; r < cfg.l; ++r) {
    for (int64_t c = 0; c < D; ++c) z.push_back(rows[r][c] + mlp.pos[r * D + c]);
  }
  for (int64_t c = 0; c < D; ++c) y[c] = mlp.b2[c];
  for (int64_t k = 0; k < hid; ++k) {
    double u = mlp.b1[k];
    for (size_t i = 0; i < z.size(); ++i) u += z[i] * mlp.w1[static_cast<int64_t>(i) * hid + k];
    const double h = u / (1.0 + std::exp(-u));
    for (int64_t c = 0; c < D; ++c) y[c] += h * mlp.w2[k * D + c];
  }
  return y;
}

}  // namespace

OracleResult nsa_oracle(const NsaConfig& cfg, const SeqLayout& layout,
                        const NsaTensors<double>& in) {
  const int64_t T = layout.total_tokens(), H = cfg.heads, G = cfg.groups, hpg = H / G;
  const int64_t dk = cfg.dk, dv = cfg.dv;
  const double scale = cfg.softmax_scale();
  OracleResult r;
  r.o = Tensor<double>({T, H, dv});
  for (auto& ob : r.o_branch) ob = Tensor<double>({T, H, dv});
  r.sel.resize(static_cast<size_t>(T * G));
  auto K = [&](int c) -> const Tensor<double>& { return in.k[cfg.kv_index(c)]; };
  auto V = [&](int c) -> const Tensor<double>& { return in.v[cfg.kv_index(c)]; };

  for (int64_t n = 0; n < layout.num_seqs(); ++n) {
    const int64_t s0 = layout.start(n), S = layout.length(n);
    const int64_t nc = S >= cfg.l ? (S - cfg.l) / cfg.d + 1 : 0;
    const int64_t nb = (S + cfg.l_sel - 1) / cfg.l_sel;
    // overlap[i][j]: raw positions of compressed token i that fall in selection block j (counted).
    Matrix overlap(nc, std::vector<double>(nb, 0.0));
    for (int64_t i = 0; i < nc; ++i) {
      for (int64_t p = i * cfg.d; p < i * cfg.d + cfg.l; ++p) overlap[i][p / cfg.l_sel] += 1.0;
    }
    for (int64_t g = 0; g < G; ++g) {
      // Compressed keys and values of this group.
      std::vector<std::vector<double>> kc(nc), vc(nc);
      for (int64_t i = 0; i < nc; ++i) {
        std::vector<const double*> krows, vrows;
        for (int64_t r2 = 0; r2 < cfg.l; ++r2) {
          const int64_t row = s0 + i * cfg.d + r2;
          krows.push_back(K(kCmp).ptr() + (row * G + g) * dk);
          vrows.push_back(V(kCmp).ptr() + (row * G + g) * dv);
        }
        kc[i] = compress_block(cfg, krows, in.phi_k, dk);
        vc[i] = compress_block(cfg, vrows, in.phi_v, dv);
      }
      std::vector<const double*> kcp, vcp, raw_k[kNumBranches], raw_v[kNumBranches];
      for (int64_t i = 0; i < nc; ++i) kcp.push_back(kc[i].data()), vcp.push_back(vc[i].data());
      for (int c : {kSel, kWin}) {
        for (int64_t p = 0; p < S; ++p) {
          raw_k[c].push_back(K(c).ptr() + ((s0 + p) * G + g) * dk);
          raw_v[c].push_back(V(c).ptr() + ((s0 + p) * G + g) * dv);
        }
      }
      for (int64_t t = 0; t < S; ++t) {
        const int64_t row = s0 + t;
        // Compressed branch per head, and the group's block scores.
        std::vector<double> score(nb, 0.0);
        std::vector<bool> cmask(nc);
        for (int64_t i = 0; i < nc; ++i) cmask[i] = i * cfg.d + cfg.l <= t + 1;
        for (int64_t h = g * hpg; h < (g + 1) * hpg; ++h) {
          std::vector<double> p;
          auto o =
              masked_attention(in.q.ptr() + (row * H + h) * dk, kcp, vcp, cmask, dk, dv, scale, &p);
          std::copy(o.begin(), o.end(), r.o_branch[kCmp].ptr() + (row * H + h) * dv);
          for (int64_t i = 0; i < nc; ++i) {
            for (int64_t j = 0; j < nb; ++j) score[j] += p[i] * overlap[i][j] / cfg.l;
          }
        }
        // Selection: forced blocks, then repeated arg-max over complete blocks (lowest index wins).
        const int64_t c = t / cfg.l_sel;
        std::set<int64_t> chosen = {0, c};
        if (c >= 1) chosen.insert(c - 1);
        while (static_cast<int64_t>(chosen.size()) < cfg.n_sel) {
          int64_t best = -1;
          for (int64_t j = 0; j < nb; ++j) {
            const bool complete = (j + 1) * cfg.l_sel <= t + 1;
            if (complete && !chosen.count(j) && (best < 0 || score[j] > score[best])) best = j;
          }
          if (best < 0) break;
          chosen.insert(best);
        }
        r.sel[row * G + g].assign(chosen.begin(), chosen.end());
        std::vector<bool> smask(S), wmask(S);
        for (int64_t p = 0; p < S; ++p) {
          smask[p] = p <= t && chosen.count(p / cfg.l_sel);
          wmask[p] = p <= t && p > t - cfg.w;
        }
        for (int64_t h = g * hpg; h < (g + 1) * hpg; ++h) {
          const double* q = in.q.ptr() + (row * H + h) * dk;
          auto os = masked_attention(q, raw_k[kSel], raw_v[kSel], smask, dk, dv, scale);
          auto ow = masked_attention(q, raw_k[kWin], raw_v[kWin], wmask, dk, dv, scale);
          std::copy(os.begin(), os.end(), r.o_branch[kSel].ptr() + (row * H + h) * dv);
          std::copy(ow.begin(), ow.end(), r.o_branch[kWin].ptr() + (row * H + h) * dv);
          for (int b = 0; b < kNumBranches; ++b) {
            for (int64_t e = 0; e < dv; ++e) {
              r.o[(row * H + h) * dv + e] +=
                  in.gate[b][row * H + h] * r.o_branch[b][(row * H + h) * dv + e];
            }
          }
        }
      }
    }
  }
  return r;
}

Tensor<double> causal_attention(const NsaConfig& cfg, const SeqLayout& layout,
                                const Tensor<double>& q, const Tensor<double>& k,
                                const Tensor<double>& v) {
  const int64_t H = cfg.heads, G = cfg.groups, dk = cfg.dk, dv = cfg.dv;
  Tensor<double> o({layout.total_tokens(), H, dv});
  for (int64_t n = 0; n < layout.num_seqs(); ++n) {
    const int64_t s0 = layout.start(n), S = layout.length(n);
    for (int64_t t = 0; t < S; ++t) {
      for (int64_t h = 0; h < H; ++h) {
        const int64_t g = h / (H / G);
        std::vector<const double*> keys, values;
        std::vector<bool> mask;
        for (int64_t p = 0; p < S; ++p) {
          keys.push_back(k.ptr() + ((s0 + p) * G + g) * dk);
          values.push_back(v.ptr() + ((s0 + p) * G + g) * dv);
          mask.push_back(p <= t);
        }
        auto out = masked_attention(q.ptr() + ((s0 + t) * H + h) * dk, keys, values, mask, dk, dv,
                                    cfg.softmax_scale());
        std::copy(out.begin(), out.end(), o.ptr() + ((s0 + t) * H + h) * dv);
      }
    }
  }
  return o;
}

}  // namespace nsa::test
