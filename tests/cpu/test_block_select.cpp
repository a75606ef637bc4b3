// Unit tests of the selection pieces on constructed inputs: the overlap mapping, the group sum,
// forced blocks, the exact tie rule and −1 padding.
#include <gtest/gtest.h>

#include <vector>

#include "../common/test_util.h"
#include "cpu/block_select.h"

namespace nsa::test {
namespace {

std::vector<int32_t> select(const std::vector<double>& scores, int64_t t, int64_t l_sel,
                            int64_t n_sel) {
  std::vector<int32_t> out(n_sel);
  cpu::select_blocks(scores.data(), t, l_sel, n_sel, out.data());
  return out;
}

TEST(BlockSelect, ForcedBlocksThenScoresThenPadding) {
  // t = 40, l_sel = 8: c = 5; forced {0, 4, 5}; candidates 1..3.
  const std::vector<double> s = {9, 0.1, 0.7, 0.3, 0, 0, 0};
  EXPECT_EQ(select(s, 40, 8, 4), (std::vector<int32_t>{0, 2, 4, 5}));
  EXPECT_EQ(select(s, 40, 8, 5), (std::vector<int32_t>{0, 2, 3, 4, 5}));
  EXPECT_EQ(select(s, 40, 8, 7), (std::vector<int32_t>{0, 1, 2, 3, 4, 5, -1}));
  EXPECT_EQ(select(s, 40, 8, 3), (std::vector<int32_t>{0, 4, 5}));
  // Early queries: c = 0 → {0}; c = 1 → {0, 1}; c = 2 → {0, 1, 2}.
  EXPECT_EQ(select(s, 3, 8, 4), (std::vector<int32_t>{0, -1, -1, -1}));
  EXPECT_EQ(select(s, 8, 8, 4), (std::vector<int32_t>{0, 1, -1, -1}));
  EXPECT_EQ(select(s, 23, 8, 4), (std::vector<int32_t>{0, 1, 2, -1}));
}

TEST(BlockSelect, ExactTiesPreferLowerIndex) {
  // c = 9; candidates 1..7 with scores tied in pairs; the tie rule picks the lower index.
  const std::vector<double> s = {0, 0.5, 0.2, 0.5, 0.7, 0.2, 0.7, 0.5, 0, 0};
  EXPECT_EQ(select(s, 72, 8, 4), (std::vector<int32_t>{0, 4, 8, 9}));
  EXPECT_EQ(select(s, 72, 8, 5), (std::vector<int32_t>{0, 4, 6, 8, 9}));
  EXPECT_EQ(select(s, 72, 8, 6), (std::vector<int32_t>{0, 1, 4, 6, 8, 9}));
  EXPECT_EQ(select(s, 72, 8, 8), (std::vector<int32_t>{0, 1, 3, 4, 6, 7, 8, 9}));
  const std::vector<double> flat(10, 0.25);
  EXPECT_EQ(select(flat, 72, 8, 6), (std::vector<int32_t>{0, 1, 2, 3, 8, 9}));
}

TEST(BlockSelect, OverlapMappingSplitsProbabilityByCoverage) {
  NsaConfig cfg = make_config({1, 1, 4, 4}, {8, 4, 8, 4, 8});
  // Token i covers [4i, 4i+8): token 0 → block 0 fully; token 1 → half block 0, half block 1.
  const std::vector<double> p = {0.2, 0.4, 0.4};
  std::vector<double> scores(4, 0.0);
  cpu::accumulate_block_scores(cfg, p.data(), 3, scores.data());
  EXPECT_DOUBLE_EQ(scores[0], 0.2 + 0.2);
  EXPECT_DOUBLE_EQ(scores[1], 0.2 + 0.4);
  EXPECT_DOUBLE_EQ(scores[2], 0.0);
  // l = d = l_sel: the identity.
  cfg = make_config({1, 1, 4, 4}, {4, 4, 4, 4, 8});
  std::fill(scores.begin(), scores.end(), 0.0);
  cpu::accumulate_block_scores(cfg, p.data(), 3, scores.data());
  EXPECT_EQ(scores, (std::vector<double>{0.2, 0.4, 0.4, 0.0}));
  // l_sel larger than l: several tokens fall in one block; mass is conserved.
  cfg = make_config({1, 1, 4, 4}, {4, 2, 8, 4, 8});
  std::fill(scores.begin(), scores.end(), 0.0);
  cpu::accumulate_block_scores(cfg, p.data(), 3, scores.data());
  EXPECT_DOUBLE_EQ(scores[0], 1.0);
}

TEST(BlockSelect, GroupScoreIsTheSumOverHeads) {
  // Head A puts most mass on block 1, head B on block 2; B's peak is larger, so the group with
  // room for one free block picks 2 for both heads, though A alone would pick 1.
  NsaConfig cfg = make_config({2, 1, 4, 4}, {4, 4, 4, 4, 8});
  const std::vector<double> head_a = {0, 0.6, 0.3, 0.1, 0, 0}, head_b = {0, 0.05, 0.9, 0.05, 0, 0};
  std::vector<double> group(8, 0.0), only_a(8, 0.0);
  cpu::accumulate_block_scores(cfg, head_a.data(), 6, group.data());
  cpu::accumulate_block_scores(cfg, head_b.data(), 6, group.data());
  cpu::accumulate_block_scores(cfg, head_a.data(), 6, only_a.data());
  // t = 27: c = 6, forced {0, 5, 6}, candidates 1..4, n_sel = 4 → one free block.
  EXPECT_EQ(select(group, 27, 4, 4), (std::vector<int32_t>{0, 2, 5, 6}));
  EXPECT_EQ(select(only_a, 27, 4, 4), (std::vector<int32_t>{0, 1, 5, 6}));
}

}  // namespace
}  // namespace nsa::test
