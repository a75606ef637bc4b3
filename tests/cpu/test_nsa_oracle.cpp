// The CPU reference against the independent brute-force oracle: outputs of every branch and the
// selected sets, over shapes that exercise GQA sizes, overlap mappings, φ = avg | mlp, shared K/V,
// packed documents and lengths that are multiples of nothing.
#include <gtest/gtest.h>

#include "../common/nsa_oracle.h"
#include "../common/test_util.h"

namespace nsa::test {
namespace {

class OracleTest : public ::testing::TestWithParam<NsaCase> {};

TEST_P(OracleTest, MatchesBruteForce) {
  const NsaCase& c = GetParam();
  const NsaConfig cfg = make_config(c.shape, c.hyper, c.phi, c.kv);
  const SeqLayout layout = SeqLayout::packed(c.cu_seqlens, c.cu_seqlens.back());
  const auto in = random_nsa_inputs<double>(cfg, layout.total_tokens(), 17);
  const OracleResult ref = nsa_oracle(cfg, layout, in);

  // Double: the two must agree to rounding, and choose identical sets.
  const NsaForward<double> f64 = nsa_forward_cpu(cfg, layout, in);
  for (int b = 0; b < kNumBranches; ++b) {
    expect_close(f64.o_branch[b], ref.o_branch[b], 1e-12, 1e-10,
                 std::string("f64 o_") + kBranchNames[b]);
  }
  expect_close(f64.o, ref.o, 1e-12, 1e-10, "f64 o");
  const int64_t G = cfg.groups, n_sel = cfg.n_sel;
  for (int64_t tg = 0; tg < layout.total_tokens() * G; ++tg) {
    std::vector<int32_t> got;
    for (int64_t k = 0; k < n_sel; ++k) {
      const int32_t b = f64.sel_idx[tg * n_sel + k];
      if (b >= 0) got.push_back(b);
    }
    ASSERT_EQ(got, ref.sel[tg]) << "selected set of (token, group) " << tg;
  }

  // fp32: outputs within fp32 rounding of the double oracle (256 ulps of O(1) values).
  const NsaForward<float> f32 = nsa_forward_cpu(cfg, layout, cast_tensors<float>(in));
  const double tol = 256 * 1.19e-7;
  expect_close(f32.o, ref.o, tol, tol, "f32 o");
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, OracleTest,
    ::testing::Values(
        // name, {H, G, dk, dv}, {l, d, l_sel, n_sel, w}, phi, kv, cu_seqlens
        NsaCase{
            "mha_overlap", {2, 2, 8, 8}, {8, 4, 16, 4, 16}, Phi::kAvg, KvMode::kSeparate, {0, 150}},
        NsaCase{"gqa2", {4, 2, 8, 6}, {4, 2, 8, 4, 10}, Phi::kAvg, KvMode::kSeparate, {0, 61}},
        NsaCase{"gqa3_mlp", {3, 1, 8, 8}, {4, 4, 8, 5, 7}, Phi::kMlp, KvMode::kSeparate, {0, 53}},
        NsaCase{"gqa6_shared", {6, 1, 4, 4}, {8, 4, 8, 4, 12}, Phi::kAvg, KvMode::kShared, {0, 45}},
        NsaCase{
            "mlp_shared_dv", {4, 2, 6, 10}, {6, 3, 12, 3, 9}, Phi::kMlp, KvMode::kShared, {0, 50}},
        NsaCase{"l_eq_lsel", {2, 1, 8, 8}, {8, 8, 8, 6, 20}, Phi::kAvg, KvMode::kSeparate, {0, 70}},
        NsaCase{"packed_docs",
                {4, 2, 8, 8},
                {8, 4, 16, 4, 16},
                Phi::kAvg,
                KvMode::kSeparate,
                {0, 37, 37, 100, 103, 130}},
        NsaCase{"packed_mlp",
                {2, 2, 8, 8},
                {4, 2, 8, 3, 5},
                Phi::kMlp,
                KvMode::kSeparate,
                {0, 3, 40, 41, 67}},
        NsaCase{
            "many_blocks", {2, 1, 4, 4}, {2, 1, 2, 7, 3}, Phi::kAvg, KvMode::kSeparate, {0, 59}},
        NsaCase{
            "short_seq", {2, 1, 8, 8}, {16, 8, 32, 4, 64}, Phi::kAvg, KvMode::kSeparate, {0, 9}}),
    [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace nsa::test
