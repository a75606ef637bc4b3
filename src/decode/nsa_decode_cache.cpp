// Incremental NSA attention with caches (see nsa_decode.h).
#include "nsa_decode_cache.h"

#include <algorithm>
#include <string>

#include "cpu/attend_row.h"
#include "cpu/block_select.h"
#include "cpu/compress.h"

namespace nsa {

NsaDecodeCache::NsaDecodeCache(const NsaConfig& cfg) : cfg_(cfg) {
  cfg.validate();
  const int64_t G = cfg.groups;
  k_win_.resize(static_cast<size_t>(cfg.w * G * cfg.dk));
  v_win_.resize(static_cast<size_t>(cfg.w * G * cfg.dv));
  k_raw_.resize(static_cast<size_t>(cfg.l * G * cfg.dk));
  v_raw_.resize(static_cast<size_t>(cfg.l * G * cfg.dv));
}

void NsaDecodeCache::prefill(const Tensor<float> (&k)[kNumBranches],
                             const Tensor<float> (&v)[kNumBranches],
                             const PhiMlpParams<float>* phi_k, const PhiMlpParams<float>* phi_v) {
  const NsaConfig& c = cfg_;
  NSA_CHECK(len_ == 0, "prefill needs an empty decode cache (it holds ", len_, " tokens)");
  const Tensor<float>& kc = k[c.kv_index(kCmp)];
  const int64_t S = kc.dim(0), G = c.groups, dk = c.dk, dv = c.dv;
  for (int b = 0; b < kNumBranches; ++b) {
    check_shape(k[c.kv_index(b)], {S, G, dk}, std::string("prefill k_") + kBranchNames[b]);
    check_shape(v[c.kv_index(b)], {S, G, dv}, std::string("prefill v_") + kBranchNames[b]);
  }
  const Tensor<float>& ks = k[c.kv_index(kSel)];
  const Tensor<float>& vs = v[c.kv_index(kSel)];
  k_sel_.assign(ks.data.begin(), ks.data.end());
  v_sel_.assign(vs.data.begin(), vs.data.end());
  for (int64_t t = std::max<int64_t>(0, S - c.w); t < S; ++t) {
    std::copy_n(k[c.kv_index(kWin)].ptr() + t * G * dk, G * dk,
                k_win_.begin() + (t % c.w) * G * dk);
    std::copy_n(v[c.kv_index(kWin)].ptr() + t * G * dv, G * dv,
                v_win_.begin() + (t % c.w) * G * dv);
  }
  for (int64_t t = std::max<int64_t>(0, S - c.l); t < S; ++t) {
    std::copy_n(kc.ptr() + t * G * dk, G * dk, k_raw_.begin() + (t % c.l) * G * dk);
    std::copy_n(v[c.kv_index(kCmp)].ptr() + t * G * dv, G * dv,
                v_raw_.begin() + (t % c.l) * G * dv);
  }
  const bool mlp = c.phi == Phi::kMlp;
  Tensor<float> kcmp, vcmp;
  cpu::compress_forward(c, SeqLayout::batch(1, S), kc, mlp ? phi_k : nullptr, kcmp);
  cpu::compress_forward(c, SeqLayout::batch(1, S), v[c.kv_index(kCmp)], mlp ? phi_v : nullptr,
                        vcmp);
  k_cmp_.assign(kcmp.data.begin(), kcmp.data.end());
  v_cmp_.assign(vcmp.data.begin(), vcmp.data.end());
  n_cmp_ = c.num_compressed(S);
  len_ = S;
}

void NsaDecodeCache::step(const float* q, const float* const k[kNumBranches],
                          const float* const v[kNumBranches], const float* const gate[kNumBranches],
                          const PhiMlpParams<float>* phi_k, const PhiMlpParams<float>* phi_v,
                          float* o, int32_t* sel) {
  const NsaConfig& c = cfg_;
  const int64_t G = c.groups, H = c.heads, hpg = H / G, dk = c.dk, dv = c.dv, t = len_;
  const float scale = static_cast<float>(c.softmax_scale());
  const float* ks = k[c.kv_index(kSel)];
  const float* vs = v[c.kv_index(kSel)];
  k_sel_.insert(k_sel_.end(), ks, ks + G * dk);
  v_sel_.insert(v_sel_.end(), vs, vs + G * dv);
  std::copy_n(k[c.kv_index(kWin)], G * dk, k_win_.begin() + (t % c.w) * G * dk);
  std::copy_n(v[c.kv_index(kWin)], G * dv, v_win_.begin() + (t % c.w) * G * dv);
  std::copy_n(k[c.kv_index(kCmp)], G * dk, k_raw_.begin() + (t % c.l) * G * dk);
  std::copy_n(v[c.kv_index(kCmp)], G * dv, v_raw_.begin() + (t % c.l) * G * dv);
  ++len_;

  // A compressed token becomes visible exactly when its block completes: emit it now.
  if (t + 1 >= c.l && (t + 1 - c.l) % c.d == 0) {
    const bool mlp = c.phi == Phi::kMlp;
    for (int kind = 0; kind < 2; ++kind) {
      const int64_t D = kind == 0 ? dk : dv;
      const std::vector<float>& ring = kind == 0 ? k_raw_ : v_raw_;
      Tensor<float> block({c.l, G, D}), out;
      for (int64_t r = 0; r < c.l; ++r) {  // positions t−l+1 .. t, oldest first
        const int64_t slot = (t - c.l + 1 + r) % c.l;
        std::copy_n(ring.begin() + slot * G * D, G * D, block.ptr() + r * G * D);
      }
      cpu::compress_forward(c, SeqLayout::batch(1, c.l), block,
                            mlp ? (kind == 0 ? phi_k : phi_v) : nullptr, out);
      std::vector<float>& dst = kind == 0 ? k_cmp_ : v_cmp_;
      dst.insert(dst.end(), out.data.begin(), out.data.end());
    }
    ++n_cmp_;
  }

  std::vector<float> probs(std::max({n_cmp_, c.n_sel * c.l_sel, c.w, int64_t{1}}));
  std::vector<float> group_probs(static_cast<size_t>(n_cmp_ + 1));
  std::vector<float> block_scores(static_cast<size_t>(t / c.l_sel + 2));
  std::vector<cpu::KeyRange> ranges(static_cast<size_t>(c.n_sel));
  std::vector<float> o_branch(static_cast<size_t>(dv));
  std::fill(o, o + H * dv, 0.0f);
  const cpu::KeyRange cmp_range{0, n_cmp_};
  // Window rows oldest first: ring slots of positions max(0, t−w+1) .. t.
  const int64_t first = std::max<int64_t>(0, t - c.w + 1), count = t - first + 1;
  const int64_t s0 = first % c.w;
  cpu::KeyRange win_ranges[2] = {{s0, std::min(c.w, s0 + count)}, {0, 0}};
  if (s0 + count > c.w) win_ranges[1] = {0, s0 + count - c.w};
  const int n_win_ranges = win_ranges[1].end > 0 ? 2 : 1;
  int64_t keys_read = 0;
  for (int64_t g = 0; g < G; ++g) {
    std::fill(block_scores.begin(), block_scores.begin() + t / c.l_sel + 1, 0.0f);
    std::fill(group_probs.begin(), group_probs.begin() + n_cmp_, 0.0f);
    const cpu::RowKv<float> cmp_g{k_cmp_.data() + g * dk, v_cmp_.data() + g * dv, G * dk, G * dv};
    std::vector<float> o_cmp_all(static_cast<size_t>(hpg * dv));
    for (int64_t hh = 0; hh < hpg; ++hh) {
      const int64_t h = g * hpg + hh;
      cpu::attend_row_forward(q + h * dk, cmp_g, &cmp_range, 1, dk, dv, scale,
                              o_cmp_all.data() + hh * dv, probs.data());
      for (int64_t i = 0; i < n_cmp_; ++i) group_probs[i] += probs[i];
    }
    cpu::accumulate_block_scores(c, group_probs.data(), n_cmp_, block_scores.data());
    int32_t* sel_g = sel + g * c.n_sel;
    cpu::select_blocks(block_scores.data(), t, c.l_sel, c.n_sel, sel_g);
    int n_ranges = 0;
    for (int64_t kk = 0; kk < c.n_sel && sel_g[kk] >= 0; ++kk) {
      const int64_t begin = sel_g[kk] * c.l_sel;
      ranges[n_ranges++] = {begin, std::min(begin + c.l_sel, t + 1)};
      keys_read += std::min(begin + c.l_sel, t + 1) - begin;
    }
    const cpu::RowKv<float> sel_kv{k_sel_.data() + g * dk, v_sel_.data() + g * dv, G * dk, G * dv};
    const cpu::RowKv<float> win_kv{k_win_.data() + g * dk, v_win_.data() + g * dv, G * dk, G * dv};
    for (int64_t hh = 0; hh < hpg; ++hh) {
      const int64_t h = g * hpg + hh;
      float* oh = o + h * dv;
      for (int64_t e = 0; e < dv; ++e) oh[e] += gate[kCmp][h] * o_cmp_all[hh * dv + e];
      cpu::attend_row_forward(q + h * dk, sel_kv, ranges.data(), n_ranges, dk, dv, scale,
                              o_branch.data(), probs.data());
      for (int64_t e = 0; e < dv; ++e) oh[e] += gate[kSel][h] * o_branch[e];
      cpu::attend_row_forward(q + h * dk, win_kv, win_ranges, n_win_ranges, dk, dv, scale,
                              o_branch.data(), probs.data());
      for (int64_t e = 0; e < dv; ++e) oh[e] += gate[kWin][h] * o_branch[e];
    }
  }
  keys_read += G * (n_cmp_ + count);
  last_bytes_ = keys_read * (dk + dv) * static_cast<int64_t>(sizeof(float));
}

}  // namespace nsa
