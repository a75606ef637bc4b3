// The NSA attention layer on the CPU: orchestration of compression, compressed attention, block
// selection, selected and window attention, and gating, forward and backward (docs/nsa.md).
//
// Forward, per query t and group g: each head of the group attends over the visible compressed
// tokens; its probabilities are mapped onto selection blocks and summed over the group's heads;
// the top-n set is chosen; every head then attends over the selected blocks and over the window,
// and the three outputs are mixed by the gates. All scratch is per thread and O(S).
//
// Backward runs parallel over (sequence, group): a group's K/V rows (raw and compressed) and its
// heads' dq/dgate rows are written by one thread only, so no atomics are needed and the result
// does not depend on the thread count.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "attend_row.h"
#include "block_select.h"
#include "compress.h"
#include "nsa/attention.h"

namespace nsa {
namespace {

std::string kv_name(const NsaConfig& cfg, char kind, int branch) {
  if (cfg.kv == KvMode::kShared) return std::string(1, kind);
  return std::string(1, kind) + "_" + kBranchNames[branch];
}

template <typename Real>
void check_phi(const PhiMlpParams<Real>& p, int64_t l, int64_t D, int64_t hid,
               const std::string& prefix) {
  check_shape(p.pos, {l, D}, prefix + "_pos");
  check_shape(p.w1, {l * D, hid}, prefix + "_w1");
  check_shape(p.b1, {hid}, prefix + "_b1");
  check_shape(p.w2, {hid, D}, prefix + "_w2");
  check_shape(p.b2, {D}, prefix + "_b2");
}

template <typename Real>
PhiMlpParams<Real> zeros_like(const PhiMlpParams<Real>& p) {
  return {Tensor<Real>(p.pos.shape), Tensor<Real>(p.w1.shape), Tensor<Real>(p.b1.shape),
          Tensor<Real>(p.w2.shape), Tensor<Real>(p.b2.shape)};
}

int64_t max_length(const SeqLayout& layout) {
  int64_t m = 0;
  for (int64_t n = 0; n < layout.num_seqs(); ++n) m = std::max(m, layout.length(n));
  return m;
}

// Raw rows [start + b·l_sel, start + min((b+1)·l_sel, t+1)) of each selected block b.
int fill_selected_ranges(const int32_t* sel, int64_t n_sel, int64_t l_sel, int64_t t,
                         cpu::KeyRange* ranges) {
  int n = 0;
  for (int64_t k = 0; k < n_sel && sel[k] >= 0; ++k) {
    const int64_t begin = sel[k] * l_sel;
    ranges[n++] = {begin, std::min(begin + l_sel, t + 1)};
  }
  return n;
}

void check_selection(const NsaConfig& cfg, const SeqLayout& layout, const Tensor<int32_t>& sel) {
  check_shape(sel, {layout.total_tokens(), cfg.groups, cfg.n_sel}, "selection");
  for (int64_t n = 0; n < layout.num_seqs(); ++n) {
    for (int64_t t = 0; t < layout.length(n); ++t) {
      const int64_t c = t / cfg.l_sel;
      for (int64_t g = 0; g < cfg.groups; ++g) {
        const int32_t* s = sel.ptr() + ((layout.start(n) + t) * cfg.groups + g) * cfg.n_sel;
        int64_t k = 0;
        for (; k < cfg.n_sel && s[k] >= 0; ++k) {
          NSA_CHECK(s[k] <= c && (k == 0 || s[k] > s[k - 1]), "selection of token ", t,
                    " (sequence ", n, ", group ", g, ") is not ascending within blocks 0..", c);
        }
        NSA_CHECK(k > 0 && s[k - 1] == c, "selection of token ", t, " (sequence ", n, ", group ", g,
                  ") lacks its current block ", c);
        for (; k < cfg.n_sel; ++k)
          NSA_CHECK(s[k] == -1, "selection of token ", t, " is not -1 padded");
      }
    }
  }
}

}  // namespace

template <typename Real>
void check_inputs(const NsaConfig& cfg, const SeqLayout& layout, const NsaTensors<Real>& in) {
  const int64_t T = layout.total_tokens(), H = cfg.heads, G = cfg.groups;
  check_shape(in.q, {T, H, cfg.dk}, "q");
  for (int c = 0; c < kNumBranches; ++c) {
    const int kv = cfg.kv_index(c);
    check_shape(in.k[kv], {T, G, cfg.dk}, kv_name(cfg, 'k', c));
    check_shape(in.v[kv], {T, G, cfg.dv}, kv_name(cfg, 'v', c));
    check_shape(in.gate[c], {T, H}, std::string("g_") + kBranchNames[c]);
  }
  if (cfg.phi == Phi::kMlp) {
    check_phi(in.phi_k, cfg.l, cfg.dk, cfg.mlp_hidden(), "phi_k");
    check_phi(in.phi_v, cfg.l, cfg.dv, cfg.mlp_hidden(), "phi_v");
  }
}

template <typename Real>
NsaTensors<Real> zeros_like_inputs(const NsaConfig& cfg, const NsaTensors<Real>& in) {
  NsaTensors<Real> z;
  z.q = Tensor<Real>(in.q.shape);
  for (int c = 0; c < kNumBranches; ++c) {
    const int kv = cfg.kv_index(c);
    if (kv == c) {
      z.k[c] = Tensor<Real>(in.k[c].shape);
      z.v[c] = Tensor<Real>(in.v[c].shape);
    }
    z.gate[c] = Tensor<Real>(in.gate[c].shape);
  }
  if (cfg.phi == Phi::kMlp) {
    z.phi_k = zeros_like(in.phi_k);
    z.phi_v = zeros_like(in.phi_v);
  }
  return z;
}

template <typename Real>
NsaForward<Real> nsa_forward_cpu(const NsaConfig& cfg, const SeqLayout& layout,
                                 const NsaTensors<Real>& in, const Tensor<int32_t>* selection) {
  cfg.validate();
  check_inputs(cfg, layout, in);
  if (selection) check_selection(cfg, layout, *selection);
  const int64_t T = layout.total_tokens(), H = cfg.heads, G = cfg.groups, hpg = H / G;
  const int64_t dk = cfg.dk, dv = cfg.dv, n_sel = cfg.n_sel, l_sel = cfg.l_sel;
  const Real scale = static_cast<Real>(cfg.softmax_scale());
  const bool mlp = cfg.phi == Phi::kMlp;

  NsaForward<Real> f;
  f.o = Tensor<Real>({T, H, dv});
  for (int c = 0; c < kNumBranches; ++c) {
    f.o_branch[c] = Tensor<Real>({T, H, dv});
    f.lse[c] = Tensor<Real>({T, H});
  }
  f.sel_idx = Tensor<int32_t>({T, G, n_sel});
  cpu::compress_forward(cfg, layout, in.k[cfg.kv_index(kCmp)], mlp ? &in.phi_k : nullptr, f.k_cmp);
  cpu::compress_forward(cfg, layout, in.v[cfg.kv_index(kCmp)], mlp ? &in.phi_v : nullptr, f.v_cmp);
  const std::vector<int64_t> cmp_offset = layout.compressed_offsets(cfg);
  const int64_t max_len = max_length(layout);
  // A query sees at most max_len keys in any branch: huge n_sel, l_sel or w never size a buffer.
  const int64_t scratch = std::max({cfg.num_compressed(max_len), std::min(n_sel * l_sel, max_len),
                                    std::min(cfg.w, max_len), int64_t{1}});
  const int64_t max_ranges = std::min(n_sel, cfg.num_selection_blocks(max_len));

#pragma omp parallel
  {
    std::vector<Real> probs(scratch), group_probs(cfg.num_compressed(max_len) + 1);
    std::vector<Real> block_scores(cfg.num_selection_blocks(max_len) + 1);
    std::vector<cpu::KeyRange> ranges(max_ranges);  // selected blocks are distinct, <= the last
    for (int64_t n = 0; n < layout.num_seqs(); ++n) {
      const int64_t start = layout.start(n), len = layout.length(n);
      const cpu::RowKv<Real> cmp_kv{f.k_cmp.ptr() + cmp_offset[n] * G * dk,
                                    f.v_cmp.ptr() + cmp_offset[n] * G * dv, G * dk, G * dv};
      const Tensor<Real>& k_sel = in.k[cfg.kv_index(kSel)];
      const Tensor<Real>& v_sel = in.v[cfg.kv_index(kSel)];
      const Tensor<Real>& k_win = in.k[cfg.kv_index(kWin)];
      const Tensor<Real>& v_win = in.v[cfg.kv_index(kWin)];
#pragma omp for schedule(dynamic, 16)
      for (int64_t t = 0; t < len; ++t) {
        const int64_t row = start + t;
        const cpu::KeyRange cmp_range{0, cfg.num_visible_compressed(t)};
        const cpu::KeyRange win_range{std::max<int64_t>(0, t - cfg.w + 1), t + 1};
        for (int64_t g = 0; g < G; ++g) {
          // Group probability of each visible compressed token (heads summed in ascending
          // order), then mapped onto blocks: the fixed order every backend follows.
          std::fill(block_scores.begin(), block_scores.begin() + t / l_sel + 1, Real(0));
          std::fill(group_probs.begin(), group_probs.begin() + cmp_range.end, Real(0));
          const cpu::RowKv<Real> cmp_g{cmp_kv.k + g * dk, cmp_kv.v + g * dv, G * dk, G * dv};
          for (int64_t h = g * hpg; h < (g + 1) * hpg; ++h) {
            const int64_t th = row * H + h;
            f.lse[kCmp][th] =
                cpu::attend_row_forward(in.q.ptr() + th * dk, cmp_g, &cmp_range, 1, dk, dv, scale,
                                        f.o_branch[kCmp].ptr() + th * dv, probs.data());
            for (int64_t i = 0; i < cmp_range.end; ++i) group_probs[i] += probs[i];
          }
          cpu::accumulate_block_scores(cfg, group_probs.data(), cmp_range.end, block_scores.data());
          int32_t* sel = f.sel_idx.ptr() + (row * G + g) * n_sel;
          if (selection) {
            std::copy_n(selection->ptr() + (row * G + g) * n_sel, n_sel, sel);
          } else {
            cpu::select_blocks(block_scores.data(), t, l_sel, n_sel, sel);
          }
          const int n_ranges = fill_selected_ranges(sel, n_sel, l_sel, t, ranges.data());
          const cpu::RowKv<Real> sel_g{k_sel.ptr() + (start * G + g) * dk,
                                       v_sel.ptr() + (start * G + g) * dv, G * dk, G * dv};
          const cpu::RowKv<Real> win_g{k_win.ptr() + (start * G + g) * dk,
                                       v_win.ptr() + (start * G + g) * dv, G * dk, G * dv};
          for (int64_t h = g * hpg; h < (g + 1) * hpg; ++h) {
            const int64_t th = row * H + h;
            const Real* q = in.q.ptr() + th * dk;
            f.lse[kSel][th] =
                cpu::attend_row_forward(q, sel_g, ranges.data(), n_ranges, dk, dv, scale,
                                        f.o_branch[kSel].ptr() + th * dv, probs.data());
            f.lse[kWin][th] =
                cpu::attend_row_forward(q, win_g, &win_range, 1, dk, dv, scale,
                                        f.o_branch[kWin].ptr() + th * dv, probs.data());
            Real* o = f.o.ptr() + th * dv;
            for (int c = 0; c < kNumBranches; ++c) {
              const Real gc = in.gate[c][th];
              const Real* oc = f.o_branch[c].ptr() + th * dv;
              for (int64_t e = 0; e < dv; ++e) o[e] += gc * oc[e];
            }
          }
        }
      }
    }
  }
  return f;
}

template <typename Real>
NsaTensors<Real> nsa_backward_cpu(const NsaConfig& cfg, const SeqLayout& layout,
                                  const NsaTensors<Real>& in, const NsaForward<Real>& f,
                                  const Tensor<Real>& d_o) {
  cfg.validate();
  check_inputs(cfg, layout, in);
  const int64_t T = layout.total_tokens(), H = cfg.heads, G = cfg.groups, hpg = H / G;
  const int64_t dk = cfg.dk, dv = cfg.dv, n_sel = cfg.n_sel;
  check_shape(d_o, {T, H, dv}, "do");
  check_shape(f.sel_idx, {T, G, n_sel}, "sel_idx");
  const Real scale = static_cast<Real>(cfg.softmax_scale());
  const bool mlp = cfg.phi == Phi::kMlp;
  NsaTensors<Real> d = zeros_like_inputs(cfg, in);
  Tensor<Real> dk_cmp(f.k_cmp.shape), dv_cmp(f.v_cmp.shape);
  const std::vector<int64_t> cmp_offset = layout.compressed_offsets(cfg);

  const int64_t items = layout.num_seqs() * G;
  const int64_t max_ranges = std::min(n_sel, cfg.num_selection_blocks(max_length(layout)));
#pragma omp parallel
  {
    std::vector<Real> do_branch(dv);
    std::vector<cpu::KeyRange> ranges(max_ranges);
#pragma omp for schedule(dynamic, 1)
    for (int64_t item = 0; item < items; ++item) {
      const int64_t n = item / G, g = item % G;
      const int64_t start = layout.start(n), len = layout.length(n);
      const int64_t cmp_row = cmp_offset[n] * G + g, raw_row = start * G + g;
      // Inputs and gradient accumulators of each branch, offset to this (sequence, group).
      cpu::RowKv<Real> kv[kNumBranches];
      Real* dk_rows[kNumBranches];
      Real* dv_rows[kNumBranches];
      kv[kCmp] = {f.k_cmp.ptr() + cmp_row * dk, f.v_cmp.ptr() + cmp_row * dv, G * dk, G * dv};
      dk_rows[kCmp] = dk_cmp.ptr() + cmp_row * dk;
      dv_rows[kCmp] = dv_cmp.ptr() + cmp_row * dv;
      for (int c : {kSel, kWin}) {
        const int i = cfg.kv_index(c);
        kv[c] = {in.k[i].ptr() + raw_row * dk, in.v[i].ptr() + raw_row * dv, G * dk, G * dv};
        dk_rows[c] = d.k[i].ptr() + raw_row * dk;
        dv_rows[c] = d.v[i].ptr() + raw_row * dv;
      }
      for (int64_t t = 0; t < len; ++t) {
        const int64_t row = start + t;
        cpu::KeyRange* branch_ranges[kNumBranches];
        int n_ranges[kNumBranches];
        cpu::KeyRange cmp_range{0, cfg.num_visible_compressed(t)};
        cpu::KeyRange win_range{std::max<int64_t>(0, t - cfg.w + 1), t + 1};
        branch_ranges[kCmp] = &cmp_range;
        n_ranges[kCmp] = 1;
        branch_ranges[kWin] = &win_range;
        n_ranges[kWin] = 1;
        branch_ranges[kSel] = ranges.data();
        n_ranges[kSel] = fill_selected_ranges(f.sel_idx.ptr() + (row * G + g) * n_sel, n_sel,
                                              cfg.l_sel, t, ranges.data());
        for (int64_t h = g * hpg; h < (g + 1) * hpg; ++h) {
          const int64_t th = row * H + h;
          const Real* dout = d_o.ptr() + th * dv;
          for (int c = 0; c < kNumBranches; ++c) {
            const Real* oc = f.o_branch[c].ptr() + th * dv;
            Real dgate = 0;
            for (int64_t e = 0; e < dv; ++e) {
              dgate += dout[e] * oc[e];
              do_branch[e] = in.gate[c][th] * dout[e];
            }
            d.gate[c][th] = dgate;
            cpu::attend_row_backward(in.q.ptr() + th * dk, kv[c], branch_ranges[c], n_ranges[c], dk,
                                     dv, scale, f.lse[c][th], oc, do_branch.data(),
                                     d.q.ptr() + th * dk, dk_rows[c], dv_rows[c]);
          }
        }
      }
    }
  }
  const int cmp_kv = cfg.kv_index(kCmp);
  cpu::compress_backward(cfg, layout, in.k[cmp_kv], mlp ? &in.phi_k : nullptr, dk_cmp, d.k[cmp_kv],
                         mlp ? &d.phi_k : nullptr);
  cpu::compress_backward(cfg, layout, in.v[cmp_kv], mlp ? &in.phi_v : nullptr, dv_cmp, d.v[cmp_kv],
                         mlp ? &d.phi_v : nullptr);
  return d;
}

#define NSA_INSTANTIATE(Real)                                                                    \
  template void check_inputs<Real>(const NsaConfig&, const SeqLayout&, const NsaTensors<Real>&); \
  template NsaTensors<Real> zeros_like_inputs<Real>(const NsaConfig&, const NsaTensors<Real>&);  \
  template NsaForward<Real> nsa_forward_cpu<Real>(                                               \
      const NsaConfig&, const SeqLayout&, const NsaTensors<Real>&, const Tensor<int32_t>*);      \
  template NsaTensors<Real> nsa_backward_cpu<Real>(const NsaConfig&, const SeqLayout&,           \
                                                   const NsaTensors<Real>&,                      \
                                                   const NsaForward<Real>&, const Tensor<Real>&);
NSA_INSTANTIATE(float)
NSA_INSTANTIATE(double)
#undef NSA_INSTANTIATE

}  // namespace nsa
