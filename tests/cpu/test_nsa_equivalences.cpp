// The equivalences of docs/nsa.md ("Equivalences") that must hold, and the invariants of selection:
//   window ≥ S with gates on the window = causal attention; l = d = l_sel = 1, n_sel ≥ S with gates
//   on selection = causal attention; causality of every branch (outputs and selections up to t do
//   not move when anything after t changes); packed documents = separate runs (forward and
//   backward); forced blocks always chosen; exact ties resolved by the lower index end to end;
//   no NaN when no compressed token is visible.
#include <gtest/gtest.h>

#include <omp.h>

#include <cmath>

#include "../common/nsa_oracle.h"
#include "../common/test_util.h"

namespace nsa::test {
namespace {

void set_gates(NsaTensors<double>& in, int on_branch) {
  for (int c = 0; c < kNumBranches; ++c) in.gate[c].fill(c == on_branch ? 1.0 : 0.0);
}

TEST(Equivalence, WideWindowIsCausalAttention) {
  for (int64_t S : {1, 17, 64}) {
    const NsaConfig cfg = make_config({6, 2, 8, 8}, {8, 4, 16, 4, S + 3});
    const SeqLayout layout = SeqLayout::batch(2, S);
    NsaTensors<double> in = random_nsa_inputs<double>(cfg, 2 * S, 11);
    set_gates(in, kWin);
    const auto f = nsa_forward_cpu(cfg, layout, in);
    expect_close(f.o, causal_attention(cfg, layout, in.q, in.k[kWin], in.v[kWin]), 1e-12, 1e-10,
                 "window=causal S=" + std::to_string(S));
  }
}

TEST(Equivalence, FullSelectionWithUnitBlocksIsCausalAttention) {
  const int64_t S = 45;
  const NsaConfig cfg = make_config({4, 1, 8, 8}, {1, 1, 1, S, 3});
  const SeqLayout layout = SeqLayout::batch(1, S);
  NsaTensors<double> in = random_nsa_inputs<double>(cfg, S, 12);
  set_gates(in, kSel);
  const auto f = nsa_forward_cpu(cfg, layout, in);
  expect_close(f.o, causal_attention(cfg, layout, in.q, in.k[kSel], in.v[kSel]), 1e-12, 1e-10,
               "unit-block selection=causal");
}

// Changing every input at positions > t0 leaves all outputs and selections at positions <= t0
// bitwise unchanged, for every branch.
TEST(Equivalence, Causality) {
  for (Phi phi : {Phi::kAvg, Phi::kMlp}) {
    const NsaConfig cfg = make_config({4, 2, 8, 8}, {8, 4, 16, 4, 12}, phi);
    const int64_t S = 90;
    const SeqLayout layout = SeqLayout::batch(1, S);
    const NsaTensors<float> base = random_nsa_inputs<float>(cfg, S, 21);
    const auto f0 = nsa_forward_cpu(cfg, layout, base);
    for (int64_t t0 : {0, 7, 8, 15, 31, 50, 88}) {
      NsaTensors<float> in = base;
      const NsaTensors<float> noise = random_nsa_inputs<float>(cfg, S, 100 + t0);
      auto perturb = [&](Tensor<float>& t, const Tensor<float>& n) {
        const int64_t row = t.numel() / S;
        for (int64_t i = (t0 + 1) * row; i < t.numel(); ++i) t[i] += 3 * n[i];
      };
      perturb(in.q, noise.q);
      for (int c = 0; c < kNumBranches; ++c) {
        perturb(in.k[c], noise.k[c]), perturb(in.v[c], noise.v[c]);
        perturb(in.gate[c], noise.gate[c]);
      }
      const auto f1 = nsa_forward_cpu(cfg, layout, in);
      for (int c = 0; c < kNumBranches; ++c) {
        const int64_t n = (t0 + 1) * cfg.heads * cfg.dv;
        for (int64_t i = 0; i < n; ++i) {
          ASSERT_EQ(f0.o_branch[c][i], f1.o_branch[c][i])
              << "branch " << kBranchNames[c] << " at t0=" << t0 << " phi=" << to_string(phi);
        }
      }
      for (int64_t i = 0; i < (t0 + 1) * cfg.groups * cfg.n_sel; ++i) {
        ASSERT_EQ(f0.sel_idx[i], f1.sel_idx[i]) << "selection at t0=" << t0;
      }
      // And something after t0 did change (the test can fail).
      bool changed = false;
      for (int64_t i = (t0 + 1) * cfg.heads * cfg.dv; i < f0.o.numel(); ++i) {
        changed |= f0.o[i] != f1.o[i];
      }
      EXPECT_TRUE(changed || t0 == S - 1);
    }
  }
}

// Packed documents give exactly the result of running each document alone, gradients included.
TEST(Equivalence, PackedDocumentsEqualSeparateRuns) {
  for (Phi phi : {Phi::kAvg, Phi::kMlp}) {
    const NsaConfig cfg = make_config({4, 2, 8, 8}, {8, 4, 16, 4, 10}, phi);
    const std::vector<int64_t> cu = {0, 37, 38, 38, 101, 131};
    const SeqLayout packed = SeqLayout::packed(cu, cu.back());
    const int64_t T = cu.back();
    const NsaTensors<float> in = random_nsa_inputs<float>(cfg, T, 31);
    NsaConfig do_cfg = cfg;
    do_cfg.dk = cfg.dv;
    const Tensor<float> d_o = random_nsa_inputs<float>(do_cfg, T, 32).q;
    const auto fp = nsa_forward_cpu(cfg, packed, in);
    const auto gp = nsa_backward_cpu(cfg, packed, in, fp, d_o);
    PhiMlpParams<float> phi_sum = zeros_like_inputs(cfg, in).phi_k;
    for (size_t n = 0; n + 1 < cu.size(); ++n) {
      const int64_t s0 = cu[n], len = cu[n + 1] - cu[n];
      if (len == 0) continue;
      auto slice = [&](const Tensor<float>& t) {
        const int64_t row = t.numel() / T;
        Tensor<float> out(t.shape);
        out.shape[0] = len;
        out.data.assign(t.data.begin() + s0 * row, t.data.begin() + (s0 + len) * row);
        return out;
      };
      NsaTensors<float> doc = in;
      doc.q = slice(in.q);
      for (int c = 0; c < kNumBranches; ++c) {
        doc.k[c] = slice(in.k[c]), doc.v[c] = slice(in.v[c]), doc.gate[c] = slice(in.gate[c]);
      }
      const SeqLayout alone = SeqLayout::batch(1, len);
      const auto fd = nsa_forward_cpu(cfg, alone, doc);
      const auto gd = nsa_backward_cpu(cfg, alone, doc, fd, slice(d_o));
      const std::string tag = " doc " + std::to_string(n) + " phi=" + to_string(phi);
      expect_equal(fd.o, slice(fp.o), "o" + tag);
      Tensor<int32_t> sel_slice = fp.sel_idx;
      const int64_t sel_row = cfg.groups * cfg.n_sel;
      sel_slice.data.assign(fp.sel_idx.data.begin() + s0 * sel_row,
                            fp.sel_idx.data.begin() + (s0 + len) * sel_row);
      sel_slice.shape[0] = len;
      expect_equal(fd.sel_idx, sel_slice, "sel_idx" + tag);
      expect_equal(gd.q, slice(gp.q), "dq" + tag);
      for (int c = 0; c < kNumBranches; ++c) {
        expect_equal(gd.k[c], slice(gp.k[c]), std::string("dk_") + kBranchNames[c] + tag);
        expect_equal(gd.v[c], slice(gp.v[c]), std::string("dv_") + kBranchNames[c] + tag);
        expect_equal(gd.gate[c], slice(gp.gate[c]), std::string("dg_") + kBranchNames[c] + tag);
      }
      for (int64_t i = 0; phi == Phi::kMlp && i < phi_sum.w1.numel(); ++i) {
        phi_sum.w1[i] += gd.phi_k.w1[i];
      }
    }
    if (phi == Phi::kMlp) {  // parameter gradients add up over documents
      expect_close(phi_sum.w1, gp.phi_k.w1, 1e-6, 1e-4, "dphi_k_w1 summed over docs");
    }
  }
}

// Over random inputs: every set holds 0, c−1, c; is ascending and distinct; is padded with −1
// only after min(n_sel, forced + complete candidates) entries.
TEST(Selection, ForcedBlocksAlwaysPresentAndSetsWellFormed) {
  const NsaConfig cfg = make_config({6, 3, 8, 8}, {8, 4, 8, 5, 16});
  const int64_t S = 200;
  const auto f =
      nsa_forward_cpu(cfg, SeqLayout::batch(2, S), random_nsa_inputs<float>(cfg, 2 * S, 41));
  for (int64_t row = 0; row < 2 * S; ++row) {
    const int64_t t = row % S, c = t / cfg.l_sel;
    const int64_t candidates = std::max<int64_t>(0, c - 2);
    const int64_t forced = 1 + (c >= 1) + (c >= 2);
    const int64_t expect_n = std::min(cfg.n_sel, forced + candidates);
    for (int64_t g = 0; g < cfg.groups; ++g) {
      const int32_t* sel = f.sel_idx.ptr() + (row * cfg.groups + g) * cfg.n_sel;
      std::vector<int32_t> set;
      for (int64_t k = 0; k < cfg.n_sel; ++k) {
        if (k < expect_n) {
          ASSERT_GE(sel[k], 0) << "t=" << t;
          if (k > 0) {
            ASSERT_GT(sel[k], sel[k - 1]) << "t=" << t;
          }
          ASSERT_LE(sel[k], c);
          set.push_back(sel[k]);
        } else {
          ASSERT_EQ(sel[k], -1) << "t=" << t;
        }
      }
      auto has = [&](int64_t b) { return std::find(set.begin(), set.end(), b) != set.end(); };
      ASSERT_TRUE(has(0) && has(c) && (c == 0 || has(c - 1))) << "forced block missing at t=" << t;
    }
  }
}

// q = 0 makes every compressed probability exactly 1/n; with l = d = l_sel every complete block
// then has exactly the same score, and the rule must pick the lowest indices.
TEST(Selection, ExactTiesEndToEnd) {
  const NsaConfig cfg = make_config({2, 1, 4, 4}, {4, 4, 4, 5, 8});
  const int64_t S = 64;
  NsaTensors<double> in = random_nsa_inputs<double>(cfg, S, 51);
  in.q.fill(0.0);
  const auto f = nsa_forward_cpu(cfg, SeqLayout::batch(1, S), in);
  for (int64_t t = 0; t < S; ++t) {
    const int64_t c = t / 4;
    std::vector<int32_t> expect = {0};
    for (int64_t j = 1; j <= c - 2 && static_cast<int64_t>(expect.size()) < cfg.n_sel - 2; ++j) {
      expect.push_back(static_cast<int32_t>(j));
    }
    if (c >= 2) expect.push_back(static_cast<int32_t>(c - 1));
    if (c >= 1) expect.push_back(static_cast<int32_t>(c));
    std::vector<int32_t> got;
    for (int64_t k = 0; k < cfg.n_sel; ++k) {
      if (f.sel_idx[t * cfg.n_sel + k] >= 0) got.push_back(f.sel_idx[t * cfg.n_sel + k]);
    }
    ASSERT_EQ(got, expect) << "t=" << t;
  }
}

// S < l: no compressed token exists. o_cmp = 0, lse_cmp = -inf, everything else finite, and the
// backward gives zero gradient to the compressed K/V and finite gradients elsewhere.
TEST(Equivalence, NoVisibleCompressedTokenGivesZeroNotNan) {
  const NsaConfig cfg = make_config({2, 1, 4, 4}, {16, 8, 16, 4, 8}, Phi::kMlp);
  for (int64_t S : {1, 5, 15}) {
    const SeqLayout layout = SeqLayout::batch(1, S);
    const NsaTensors<float> in = random_nsa_inputs<float>(cfg, S, 61);
    const auto f = nsa_forward_cpu(cfg, layout, in);
    for (float x : f.o_branch[kCmp].data) ASSERT_EQ(x, 0.0f);
    for (float x : f.lse[kCmp].data) ASSERT_TRUE(std::isinf(x) && x < 0);
    for (float x : f.o.data) ASSERT_TRUE(std::isfinite(x));
    Tensor<float> d_o({S, cfg.heads, cfg.dv}, 1.0f);
    const auto g = nsa_backward_cpu(cfg, layout, in, f, d_o);
    for (float x : g.k[kCmp].data) ASSERT_EQ(x, 0.0f);
    for (float x : g.phi_k.w1.data) ASSERT_EQ(x, 0.0f);
    for (float x : g.q.data) ASSERT_TRUE(std::isfinite(x));
    for (float x : g.gate[kCmp].data) ASSERT_EQ(x, 0.0f);
  }
}

// The backward's result does not depend on the number of OpenMP threads (it is deterministic).
TEST(Equivalence, BackwardIsDeterministic) {
  const NsaConfig cfg = make_config({4, 2, 8, 8}, {8, 4, 16, 4, 12}, Phi::kMlp);
  const int64_t S = 150;
  const SeqLayout layout = SeqLayout::batch(2, S);
  const NsaTensors<float> in = random_nsa_inputs<float>(cfg, 2 * S, 71);
  Tensor<float> d_o({2 * S, cfg.heads, cfg.dv}, 0.5f);
  const auto f = nsa_forward_cpu(cfg, layout, in);
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  const auto a = nsa_backward_cpu(cfg, layout, in, f, d_o);
  omp_set_num_threads(3);
  const auto b = nsa_backward_cpu(cfg, layout, in, f, d_o);
  omp_set_num_threads(threads);
  expect_equal(a.q, b.q, "dq 1 vs 3 threads");
  expect_equal(a.k[kSel], b.k[kSel], "dk_sel 1 vs 3 threads");
  expect_equal(a.phi_k.w1, b.phi_k.w1, "dphi_k_w1 1 vs 3 threads");
}

}  // namespace
}  // namespace nsa::test

namespace nsa::test {
namespace {

// A given selection replaces the top-n: feeding back the forward's own choice reproduces it
// exactly, another valid choice changes o_sel, and malformed sets are refused.
TEST(Selection, GivenSelectionOverridesTopN) {
  const NsaConfig cfg = make_config({4, 2, 8, 8}, {8, 4, 8, 4, 12});
  const int64_t S = 80;
  const SeqLayout layout = SeqLayout::batch(1, S);
  const NsaTensors<float> in = random_nsa_inputs<float>(cfg, S, 81);
  const auto f = nsa_forward_cpu(cfg, layout, in);
  const auto same = nsa_forward_cpu(cfg, layout, in, &f.sel_idx);
  expect_equal(same.o, f.o, "o with its own selection");
  Tensor<int32_t> other = f.sel_idx;
  const int64_t row = S - 1, c = row / cfg.l_sel;  // 9: forced {0, 8, 9}, one free slot
  int32_t* s = other.ptr() + row * cfg.groups * cfg.n_sel;
  const int32_t free_block = s[1] == 1 ? 2 : 1;
  s[0] = 0, s[1] = free_block, s[2] = static_cast<int32_t>(c - 1), s[3] = static_cast<int32_t>(c);
  const auto changed = nsa_forward_cpu(cfg, layout, in, &other);
  EXPECT_NE(changed.o_branch[kSel][row * cfg.heads * cfg.dv],
            f.o_branch[kSel][row * cfg.heads * cfg.dv]);
  s[3] = -1;  // drops the current block
  EXPECT_THROW(nsa_forward_cpu(cfg, layout, in, &other), Error);
}

}  // namespace
}  // namespace nsa::test
