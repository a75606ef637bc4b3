// CUDA NSA attention against the CPU reference, on fresh random inputs over a sweep of shapes.
//
// Inputs are rounded to bf16 once and both backends read the same values. The CPU then runs on
// the GPU's block choice, so outputs and gradients are compared on identical sets; the sets
// themselves are compared separately: they must match except where the CPU's scores of the two
// differing blocks are within bf16 rounding (2^-8 relative to the larger: the GPU scores with
// bf16-rounded compressed keys), and such exceptions are counted and printed.
// Tolerances follow the "k× a low-precision reference" rule: the GPU keeps o and the per-branch
// outputs in bf16 and its backward reads those bf16 outputs, so the low-precision reference is the
// CPU's fp32 result with the same roundings applied (outputs rounded to bf16; the backward run on
// bf16-rounded per-branch outputs). The tensor cores also take their operands in bf16 – the
// probabilities P and g·P, dS, and the compressed K/V are rounded once before each product – which
// moves a result by at most about u·Σ|terms| with u = 2^-8. So the GPU's max error against the fp32
// reference must be at most 2× the low-precision reference's plus u·max|ref|; each check prints its
// headroom. A masking bug moves results by far more than that, and causality is also tested
// bitwise (CudaCausality).
#include <gtest/gtest.h>

#include <cuda_bf16.h>
#include <cmath>
#include <tuple>

#include "../common/test_util.h"
#include "cpu/attend_row.h"
#include "cpu/block_select.h"
#include "cuda/common/cuda_check.h"
#include "cuda/nsa/nsa_backward_dkdv.h"
#include "cuda/nsa/nsa_cuda_layer.h"

namespace nsa::test {
namespace {

float round_bf16(float x) {
  return __bfloat162float(__float2bfloat16(x));
}

void round_all(Tensor<float>& t) {
  for (float& x : t.data) x = round_bf16(x);
}

NsaTensors<float> bf16_inputs(const NsaConfig& cfg, int64_t T, uint64_t seed) {
  NsaTensors<float> in = random_nsa_inputs<float>(cfg, T, seed);
  round_all(in.q);
  for (int c = 0; c < kNumBranches; ++c)
    round_all(in.k[c]), round_all(in.v[c]), round_all(in.gate[c]);
  return in;
}

// bf16 unit roundoff: one rounding of a tensor-core operand.
constexpr double kBf16Unit = 1.0 / 256;

// max|gpu − ref| <= 2·max|lowp − ref| + u·max|ref| + 1e-6 (see the file comment).
void expect_within_lowp(const Tensor<float>& gpu, const Tensor<float>& ref,
                        const Tensor<float>& lowp, const std::string& what) {
  ASSERT_EQ(gpu.shape, ref.shape) << what;
  double err = 0, lowp_err = 0, ref_max = 0;
  for (int64_t i = 0; i < ref.numel(); ++i) {
    ASSERT_TRUE(std::isfinite(gpu[i])) << what << "[" << i << "] = " << gpu[i];
    err = std::max(err, std::fabs(static_cast<double>(gpu[i]) - ref[i]));
    lowp_err = std::max(lowp_err, std::fabs(static_cast<double>(lowp[i]) - ref[i]));
    ref_max = std::max(ref_max, std::fabs(static_cast<double>(ref[i])));
  }
  const double tol = 2 * lowp_err + kBf16Unit * ref_max + 1e-6;
  EXPECT_LE(err, tol) << what << ": max error " << err << ", low-precision reference " << lowp_err
                      << ", u·max|ref| " << kBf16Unit * ref_max;
  std::printf("  %-16s max err %.3e (bf16 reference %.3e, u·max|ref| %.3e), headroom %.1fx\n",
              what.c_str(), err, lowp_err, kBf16Unit * ref_max, err > 0 ? tol / err : INFINITY);
}

Tensor<float> rounded(Tensor<float> t) {
  round_all(t);
  return t;
}

// CPU group scores of every block for one query (row, group), as the reference computes them.
std::vector<float> cpu_block_scores(const NsaConfig& cfg, const SeqLayout& layout,
                                    const NsaTensors<float>& in, const NsaForward<float>& f,
                                    int64_t n, int64_t t, int64_t g) {
  const int64_t G = cfg.groups, dk = cfg.dk, dv = cfg.dv, hpg = cfg.heads_per_group();
  const int64_t nvis = cfg.num_visible_compressed(t), row = layout.start(n) + t;
  const int64_t c0 = layout.compressed_offsets(cfg)[n];
  std::vector<float> probs(nvis + 1), gprob(nvis + 1, 0.f), out(dv), scores(t / cfg.l_sel + 1, 0.f);
  const cpu::RowKv<float> kv{f.k_cmp.ptr() + (c0 * G + g) * dk, f.v_cmp.ptr() + (c0 * G + g) * dv,
                             G * dk, G * dv};
  const cpu::KeyRange range{0, nvis};
  for (int64_t h = g * hpg; h < (g + 1) * hpg; ++h) {
    cpu::attend_row_forward(in.q.ptr() + (row * cfg.heads + h) * dk, kv, &range, 1, dk, dv,
                            static_cast<float>(cfg.softmax_scale()), out.data(), probs.data());
    for (int64_t i = 0; i < nvis; ++i) gprob[i] += probs[i];
  }
  cpu::accumulate_block_scores(cfg, gprob.data(), nvis, scores.data());
  return scores;
}

struct CudaCase {
  const char* name;
  Shape5 shape;
  Hyper hyper;
  KvMode kv;
  std::vector<int64_t> cu_seqlens;
  Phi phi = Phi::kAvg;
};

class CudaVsCpu : public ::testing::TestWithParam<CudaCase> {};

TEST_P(CudaVsCpu, ForwardBackwardMatchReference) {
  const CudaCase& c = GetParam();
  const NsaConfig cfg = make_config(c.shape, c.hyper, c.phi, c.kv);
  const SeqLayout layout = SeqLayout::packed(c.cu_seqlens, c.cu_seqlens.back());
  const int64_t T = layout.total_tokens();
  const NsaTensors<float> in = bf16_inputs(cfg, T, 1000 + T);
  NsaConfig do_cfg = cfg;
  do_cfg.dk = cfg.dv;
  Tensor<float> d_o = random_nsa_inputs<float>(do_cfg, T, 77).q;
  round_all(d_o);

  cuda::NsaCudaLayer layer(cfg, layout);
  layer.set_inputs(in);
  layer.set_output_grad(d_o);
  layer.poison_outputs();
  layer.forward();
  layer.backward();
  const NsaForward<float> gf = layer.download_forward();

  // Selection: GPU sets vs the CPU's own choice.
  const NsaForward<float> own = nsa_forward_cpu(cfg, layout, in);
  int64_t mismatches = 0;
  for (int64_t n = 0; n < layout.num_seqs(); ++n) {
    for (int64_t t = 0; t < layout.length(n); ++t) {
      for (int64_t g = 0; g < cfg.groups; ++g) {
        const int64_t base = ((layout.start(n) + t) * cfg.groups + g) * cfg.n_sel;
        std::vector<int32_t> a(gf.sel_idx.ptr() + base, gf.sel_idx.ptr() + base + cfg.n_sel);
        std::vector<int32_t> b(own.sel_idx.ptr() + base, own.sel_idx.ptr() + base + cfg.n_sel);
        if (a == b) continue;
        ++mismatches;
        const std::vector<float> s = cpu_block_scores(cfg, layout, in, own, n, t, g);
        for (size_t k = 0; k < a.size(); ++k) {
          if (std::find(b.begin(), b.end(), a[k]) != b.end()) continue;
          // a[k] chosen by the GPU only: some CPU-only block must score within rounding of it.
          float closest = INFINITY;
          for (int32_t x : b) {
            if (x >= 0 && std::find(a.begin(), a.end(), x) == a.end()) {
              closest = std::min(closest, std::fabs(s[x] - s[a[k]]));
            }
          }
          EXPECT_LE(closest, kBf16Unit * std::max(s[a[k]], 1e-6f))
              << "GPU chose block " << a[k] << " for t=" << t << " g=" << g
              << " where the CPU's choice scores clearly higher";
        }
      }
    }
  }
  std::printf(
      "  selection: %lld of %lld (token, group) sets differ from the CPU's, all near-ties\n",
      static_cast<long long>(mismatches), static_cast<long long>(T * cfg.groups));

  // Outputs and gradients on the GPU's sets, against fp32 and the bf16-rounded reference.
  const NsaForward<float> rf = nsa_forward_cpu(cfg, layout, in, &gf.sel_idx);
  const NsaTensors<float> rg = nsa_backward_cpu(cfg, layout, in, rf, d_o);
  NsaForward<float> rf_lowp = rf;
  for (int b = 0; b < kNumBranches; ++b) round_all(rf_lowp.o_branch[b]);
  const NsaTensors<float> rg_lowp = nsa_backward_cpu(cfg, layout, in, rf_lowp, d_o);
  // Both selected-branch kernels; the block-major one also in row chunks of 7 rows, and with the
  // selection's Q rows forced into each of its two places (the sets must not change a bit).
  const int64_t row_bytes =
      cuda::sel_partial_bytes_per_row(cfg.heads, cfg.n_sel, cfg.l_sel, cfg.dk, cfg.dv);
  using cuda::SelectedKernel, cuda::SelectQ;
  const int64_t full = cuda::kSelPartialBudgetBytes;
  NsaForward<float> forked_f;  // the "block-major" run's results: its passes on two streams
  NsaTensors<float> forked;
  constexpr bool kTwo = true, kOne = false;  // streams: the layer's fork on or off
  for (const auto& [kernel, budget, select_q, fork, label] :
       {std::tuple{SelectedKernel::kQueryMajor, full, SelectQ::kAuto, kTwo, "query-major"},
        std::tuple{SelectedKernel::kBlockMajor, full, SelectQ::kAuto, kTwo, "block-major"},
        std::tuple{SelectedKernel::kBlockMajor, 7 * row_bytes, SelectQ::kAuto, kTwo,
                   "block-major, 7-row chunks"},
        std::tuple{SelectedKernel::kBlockMajor, full, SelectQ::kGlobal, kTwo,
                   "block-major, selection Q from global memory"},
        std::tuple{SelectedKernel::kBlockMajor, full, SelectQ::kShared, kTwo,
                   "block-major, selection Q in shared memory"},
        std::tuple{SelectedKernel::kBlockMajor, full, SelectQ::kAuto, kOne,
                   "block-major, one stream"}}) {
    SCOPED_TRACE(label);
    std::printf("  selected kernel: %s\n", label);
    layer.set_selected_kernel(kernel, budget);
    layer.set_select_q(select_q);
    layer.set_fork(fork);
    const bool one_stream = !fork;
    layer.poison_outputs();
    layer.forward();
    layer.backward();
    const NsaForward<float> vf = layer.download_forward();
    const NsaTensors<float> vg = layer.download_grads();
    expect_equal(vf.sel_idx, gf.sel_idx, "sel_idx");
    if (std::string(label) == "block-major") forked_f = vf, forked = vg;
    if (one_stream) {  // the same bits whether the branches ran beside each other or not
      expect_equal(vf.o, forked_f.o, "o, one stream vs two");
      for (int b = 0; b < kNumBranches; ++b) {
        expect_equal(vf.o_branch[b], forked_f.o_branch[b], "o_branch, one stream vs two");
      }
      expect_equal(vg.q, forked.q, "dq, one stream vs two");
      for (int b = 0; b < kNumBranches; ++b) {
        expect_equal(vg.k[b], forked.k[b], "dk, one stream vs two");
        expect_equal(vg.v[b], forked.v[b], "dv, one stream vs two");
        expect_equal(vg.gate[b], forked.gate[b], "dg, one stream vs two");
      }
    }
    expect_within_lowp(vf.o, rf.o, rounded(rf.o), "o");
    for (int b = 0; b < kNumBranches; ++b) {
      const std::string name = kBranchNames[b];
      expect_within_lowp(vf.o_branch[b], rf.o_branch[b], rf_lowp.o_branch[b], "o_" + name);
      expect_close(vf.lse[b], rf.lse[b], kBf16Unit, 1e-5, "lse_" + name);
    }
    expect_close(vf.k_cmp, rf.k_cmp, 1e-5, 1e-4, "k_cmp");
    expect_close(vf.v_cmp, rf.v_cmp, 1e-5, 1e-4, "v_cmp");
    expect_within_lowp(vg.q, rg.q, rg_lowp.q, "dq");
    for (int b = 0; b < kNumBranches; ++b) {
      const std::string name = kBranchNames[b];
      if (cfg.kv_index(b) == b) {
        expect_within_lowp(vg.k[b], rg.k[b], rg_lowp.k[b], "dk_" + name);
        expect_within_lowp(vg.v[b], rg.v[b], rg_lowp.v[b], "dv_" + name);
      }
      expect_within_lowp(vg.gate[b], rg.gate[b], rg_lowp.gate[b], "dg_" + name);
    }
    if (cfg.phi == Phi::kMlp) {
      for (auto [name, g, r, lp] : {std::tuple{"phi_k", &vg.phi_k, &rg.phi_k, &rg_lowp.phi_k},
                                    std::tuple{"phi_v", &vg.phi_v, &rg.phi_v, &rg_lowp.phi_v}}) {
        const std::string n = std::string("d") + name;
        expect_within_lowp(g->pos, r->pos, lp->pos, n + "_pos");
        expect_within_lowp(g->w1, r->w1, lp->w1, n + "_w1");
        expect_within_lowp(g->b1, r->b1, lp->b1, n + "_b1");
        expect_within_lowp(g->w2, r->w2, lp->w2, n + "_w2");
        expect_within_lowp(g->b2, r->b2, lp->b2, n + "_b2");
      }
    }

    // Deterministic: a second forward and backward give bit-identical results.
    layer.forward();
    layer.backward();
    const NsaForward<float> f2 = layer.download_forward();
    const NsaTensors<float> again = layer.download_grads();
    expect_equal(f2.o_branch[kSel], vf.o_branch[kSel], "o_sel run-to-run");
    expect_equal(again.q, vg.q, "dq run-to-run");
    expect_equal(again.k[cfg.kv_index(kSel)], vg.k[cfg.kv_index(kSel)], "dk_sel run-to-run");
    expect_equal(again.v[kCmp], vg.v[kCmp], "dv_cmp run-to-run");
  }

  // The window's dK/dV in one chunk per unit – what win_dkdv_chunks picks for long inputs (these
  // shapes take two): the same gradients, within the reference's tolerance. (Separate K/V only:
  // with shared K/V the other branches add to what the window writes.)
  if (cfg.kv_index(kWin) == kWin) {
    cuda::launch_nsa_backward_dkdv(layer.params(), cuda::Branch::kWin,
                                   layer.units(cuda::Branch::kWin),
                                   layer.num_units(cuda::Branch::kWin), 1, false,
                                   layer.backward_buffers().partial.get(), nullptr);
    NSA_CUDA_CHECK(cudaDeviceSynchronize());
    const NsaTensors<float> one = layer.download_grads();
    expect_within_lowp(one.k[kWin], rg.k[kWin], rg_lowp.k[kWin], "dk_win (one chunk)");
    expect_within_lowp(one.v[kWin], rg.v[kWin], rg_lowp.v[kWin], "dv_win (one chunk)");
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, CudaVsCpu,
    ::testing::Values(
        // name, {H, G, dk, dv}, {l, d, l_sel, n_sel, w}, kv, cu_seqlens
        CudaCase{"h1", {2, 2, 32, 32}, {16, 8, 32, 4, 64}, KvMode::kSeparate, {0, 333}},
        CudaCase{"h2_batch", {4, 2, 16, 16}, {16, 8, 32, 5, 40}, KvMode::kSeparate, {0, 257, 514}},
        CudaCase{
            "h6_m7c_like", {12, 2, 64, 64}, {32, 16, 64, 16, 512}, KvMode::kSeparate, {0, 1500}},
        CudaCase{
            "h16_paper_like", {16, 1, 192, 128}, {32, 16, 64, 6, 100}, KvMode::kSeparate, {0, 701}},
        CudaCase{"h4_d192_shared_packed",
                 {4, 2, 192, 128},
                 {32, 16, 64, 8, 128},
                 KvMode::kShared,
                 {0, 777, 1900}},
        CudaCase{"h4_d128_packed",
                 {4, 2, 128, 128},
                 {32, 16, 64, 4, 160},
                 KvMode::kShared,
                 {0, 300, 1000}},
        CudaCase{
            "h3_d64_odd_group", {3, 1, 64, 64}, {16, 8, 32, 4, 70}, KvMode::kSeparate, {0, 450}},
        CudaCase{"h3_shared", {6, 2, 32, 16}, {8, 4, 16, 6, 33}, KvMode::kShared, {0, 421}},
        CudaCase{"packed_docs",
                 {4, 2, 32, 32},
                 {16, 8, 32, 4, 50},
                 KvMode::kSeparate,
                 {0, 5, 200, 200, 331, 600}},
        CudaCase{"short", {4, 1, 16, 16}, {32, 16, 64, 4, 64}, KvMode::kSeparate, {0, 20}},
        // n_sel above 33: a row's top list takes two entries a lane in the selection kernel.
        CudaCase{"nsel40", {4, 2, 32, 32}, {16, 8, 16, 40, 64}, KvMode::kSeparate, {0, 1200}},
        // Selection blocks of two and of one and a half 64-row dK/dV units.
        CudaCase{"lsel128", {4, 2, 64, 64}, {32, 16, 128, 4, 128}, KvMode::kSeparate, {0, 1100}},
        CudaCase{
            "lsel96_packed", {6, 2, 32, 32}, {32, 16, 96, 3, 64}, KvMode::kShared, {0, 250, 777}},
        CudaCase{"mlp_h6",
                 {12, 2, 64, 64},
                 {32, 16, 64, 8, 128},
                 KvMode::kSeparate,
                 {0, 900},
                 Phi::kMlp},
        CudaCase{"mlp_shared_packed",
                 {4, 2, 32, 16},
                 {16, 8, 32, 4, 40},
                 KvMode::kShared,
                 {0, 10, 310, 555},
                 Phi::kMlp},
        CudaCase{"mlp_short",
                 {2, 1, 16, 16},
                 {32, 16, 64, 4, 64},
                 KvMode::kSeparate,
                 {0, 25},
                 Phi::kMlp}),
    [](const auto& info) { return std::string(info.param.name); });

// Every query attends to one hot block: all selections contain it, and the selected branch's
// dK/dV accumulation over very long query lists (the inverted index's largest segment) is right,
// as are the block-major forward and dq whose CTAs then all share one block.
TEST(CudaHotBlock, ManyQueriesSelectTheSameBlock) {
  const NsaConfig cfg = make_config({4, 1, 32, 32}, {16, 16, 16, 4, 16});
  const int64_t S = 900;
  const SeqLayout layout = SeqLayout::batch(1, S);
  NsaTensors<float> in = bf16_inputs(cfg, S, 5);
  for (int64_t t = 0; t < S; ++t) {
    for (int64_t e = 0; e < cfg.dk; ++e) {
      for (int64_t h = 0; h < cfg.heads; ++h)
        in.q[(t * cfg.heads + h) * cfg.dk + e] = round_bf16(e % 2 ? 1.f : -1.f);
    }
  }
  for (int64_t r = 3 * 16; r < 4 * 16; ++r) {  // block 3 keys align with every query
    for (int64_t e = 0; e < cfg.dk; ++e)
      in.k[kCmp][r * cfg.dk + e] = round_bf16(e % 2 ? 2.f : -2.f);
  }
  Tensor<float> d_o({S, cfg.heads, cfg.dv}, 0.25f);
  for (const auto kernel : {cuda::SelectedKernel::kQueryMajor, cuda::SelectedKernel::kBlockMajor}) {
    cuda::NsaCudaLayer layer(cfg, layout);
    layer.set_selected_kernel(kernel);
    layer.set_inputs(in);
    layer.set_output_grad(d_o);
    layer.forward();
    layer.backward();
    const auto gf = layer.download_forward();
    const auto gg = layer.download_grads();
    int64_t with_block3 = 0;
    for (int64_t t = 5 * 16; t < S; ++t) {
      for (int64_t k = 0; k < cfg.n_sel; ++k) with_block3 += gf.sel_idx[t * cfg.n_sel + k] == 3;
    }
    EXPECT_EQ(with_block3, S - 5 * 16) << "every query from block 5 on should select block 3";
    const auto rf = nsa_forward_cpu(cfg, layout, in, &gf.sel_idx);
    const auto rg = nsa_backward_cpu(cfg, layout, in, rf, d_o);
    auto rf_lowp = rf;
    for (int b = 0; b < kNumBranches; ++b) round_all(rf_lowp.o_branch[b]);
    const auto rg_lowp = nsa_backward_cpu(cfg, layout, in, rf_lowp, d_o);
    expect_within_lowp(gf.o_branch[kSel], rf.o_branch[kSel], rf_lowp.o_branch[kSel],
                       "o_sel (hot block)");
    expect_within_lowp(gg.q, rg.q, rg_lowp.q, "dq (hot block)");
    expect_within_lowp(gg.k[kSel], rg.k[kSel], rg_lowp.k[kSel], "dk_sel (hot block)");
    expect_within_lowp(gg.v[kSel], rg.v[kSel], rg_lowp.v[kSel], "dv_sel (hot block)");
  }
}

// Changing every input of rows after t0 leaves the forward of rows <= t0 bit-identical: outputs,
// log-sum-exps and selected blocks (the tensor-core tiles mask exactly, nothing leaks).
TEST(CudaCausality, FutureRowsDoNotChangeThePast) {
  const NsaConfig cfg = make_config({4, 2, 64, 64}, {32, 16, 64, 6, 128});
  const int64_t S = 777, t0 = 400;
  const SeqLayout layout = SeqLayout::batch(1, S);
  const NsaTensors<float> in = bf16_inputs(cfg, S, 11);
  NsaTensors<float> changed = in;
  const NsaTensors<float> other = bf16_inputs(cfg, S, 12);
  const auto replace_future = [&](Tensor<float>& t, const Tensor<float>& from) {
    const int64_t per_row = t.numel() / S;
    std::copy(from.data.begin() + (t0 + 1) * per_row, from.data.end(),
              t.data.begin() + (t0 + 1) * per_row);
  };
  replace_future(changed.q, other.q);
  for (int c = 0; c < kNumBranches; ++c) {
    replace_future(changed.k[c], other.k[c]), replace_future(changed.v[c], other.v[c]);
    replace_future(changed.gate[c], other.gate[c]);
  }
  const auto run = [&](const NsaTensors<float>& x, cuda::SelectedKernel kernel) {
    cuda::NsaCudaLayer layer(cfg, layout);
    layer.set_selected_kernel(kernel);
    layer.set_inputs(x);
    layer.forward();
    return layer.download_forward();
  };
  for (const auto kernel : {cuda::SelectedKernel::kQueryMajor, cuda::SelectedKernel::kBlockMajor}) {
    const NsaForward<float> a = run(in, kernel), b = run(changed, kernel);
    const auto past_equal = [&](const auto& x, const auto& y, const std::string& what) {
      const int64_t per_row = x.numel() / S;
      int64_t differ = 0;
      for (int64_t i = 0; i < (t0 + 1) * per_row; ++i) differ += !(x[i] == y[i]) && !(x[i] != x[i]);
      EXPECT_EQ(differ, 0) << what << ": past rows changed with the future";
      int64_t future_differ = 0;
      for (int64_t i = (t0 + 1) * per_row; i < x.numel(); ++i) future_differ += x[i] != y[i];
      EXPECT_GT(future_differ, 0) << what << ": the future rows did not change at all";
    };
    past_equal(a.o, b.o, "o");
    for (int c = 0; c < kNumBranches; ++c) {
      past_equal(a.o_branch[c], b.o_branch[c], std::string("o_") + kBranchNames[c]);
      past_equal(a.lse[c], b.lse[c], std::string("lse_") + kBranchNames[c]);
    }
    past_equal(a.sel_idx, b.sel_idx, "sel_idx");
  }
}

TEST(CudaLayer, RejectsHeadDimsThatAreNotBuilt) {
  const NsaConfig cfg = make_config({4, 2, 48, 48}, {16, 8, 32, 4, 64});
  try {
    cuda::NsaCudaLayer layer(cfg, SeqLayout::batch(1, 64));
    ADD_FAILURE() << "dk = dv = 48 should be rejected";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("head dims"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace nsa::test
