// attention_mass (the needle probe's "did the head look at it?"): over a span holding every key a
// branch attends, that branch's mass is 1 (the compressed branch's 0 where it sees no compressed
// token) – which checks the log-sum-exp it reads and each branch's key set; key by key the
// selected and window masses add up to the same; a block the selection skipped gets none, a key
// no visible compressed token covers gets no compressed mass; a span outside the row's sequence
// is refused by name.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "../common/test_util.h"
#include "model/attention_mass.h"
#include "nsa/error.h"

namespace nsa::test {
namespace {

struct Fixture {
  NsaConfig cfg = make_config({4, 2, 8, 8}, {8, 4, 8, 4, 12});
  SeqLayout layout = SeqLayout::packed({0, 70, 133}, 133);  // two documents, no multiple of 8
  NsaTensors<double> in = random_nsa_inputs<double>(cfg, 133, 5);
  NsaForward<double> fwd = nsa_forward_cpu(cfg, layout, in);
};

TEST(AttentionMass, EveryKeyABranchAttendsHoldsAllItsMass) {
  const Fixture f;
  std::vector<MassQuery> q;
  for (const int64_t row : {0, 1, 11, 12, 40, 69, 70, 71, 100, 132}) {
    const int64_t start = row < 70 ? 0 : 70, end = row < 70 ? 70 : 133;
    q.push_back({row, start, row + 1});  // every key up to the row
    q.push_back({row, start, end});      // and the ones after it, which no branch attends
  }
  const std::vector<float> m = attention_mass(f.cfg, f.layout, f.in, f.fwd, q);
  ASSERT_EQ(m.size(), q.size() * 4 * 3);
  for (size_t i = 0; i < q.size(); ++i) {
    const int64_t t = q[i].row - (q[i].row < 70 ? 0 : 70);
    const double cmp = f.cfg.num_visible_compressed(t) > 0 ? 1.0 : 0.0;  // l = 8: from t = 7
    for (size_t h = 0; h < 4; ++h) {
      EXPECT_NEAR(m[(i * 4 + h) * 3 + kCmp], cmp, 1e-6) << "query " << i << " head " << h;
      EXPECT_NEAR(m[(i * 4 + h) * 3 + kSel], 1.0, 1e-6) << "query " << i << " head " << h;
      EXPECT_NEAR(m[(i * 4 + h) * 3 + kWin], 1.0, 1e-6) << "query " << i << " head " << h;
    }
  }
}

TEST(AttentionMass, KeyByKeyAddsUpAndSkippedBlocksGetNone) {
  const Fixture f;
  const int64_t row = 69, H = 4, hpg = 2;  // block 8 of a document of 70: 4 of its 9 blocks chosen
  std::vector<MassQuery> q;
  for (int64_t j = 0; j <= row; ++j) q.push_back({row, j, j + 1});
  const std::vector<float> m = attention_mass(f.cfg, f.layout, f.in, f.fwd, q);
  for (int64_t h = 0; h < H; ++h) {
    const int32_t* sel = f.fwd.sel_idx.ptr() + (row * 2 + h / hpg) * 4;
    double sum_sel = 0, sum_win = 0;
    int skipped = 0;
    for (int64_t j = 0; j <= row; ++j) {
      const float mc = m[(j * H + h) * 3 + kCmp], ms = m[(j * H + h) * 3 + kSel],
                  mw = m[(j * H + h) * 3 + kWin];
      // Compressed token i covers keys 4i .. 4i + 7 and is visible from t = 4i + 7: up to i = 15.
      if (j <= 67) {
        EXPECT_GT(mc, 0.0f) << "key " << j;
      } else {
        EXPECT_EQ(mc, 0.0f) << "key " << j << " is in no visible compressed token";
      }
      sum_sel += ms, sum_win += mw;
      if (std::find(sel, sel + 4, static_cast<int32_t>(j / 8)) == sel + 4) {
        EXPECT_EQ(ms, 0.0f) << "key " << j << " lies in a block the selection skipped";
        ++skipped;
      } else {
        EXPECT_GT(ms, 0.0f) << "key " << j;
      }
      if (j <= row - 12) {
        EXPECT_EQ(mw, 0.0f) << "key " << j << " lies before the window";
      }
    }
    EXPECT_GT(skipped, 0);
    EXPECT_NEAR(sum_sel, 1.0, 1e-6);
    EXPECT_NEAR(sum_win, 1.0, 1e-6);
  }
}

TEST(AttentionMass, ASpanOutsideTheRowsSequenceIsRefused) {
  const Fixture f;
  for (const MassQuery& bad :
       {MassQuery{100, 60, 75}, MassQuery{10, 5, 71}, MassQuery{133, 0, 1}}) {
    try {
      attention_mass(f.cfg, f.layout, f.in, f.fwd, {bad});
      ADD_FAILURE() << "row " << bad.row << ", keys [" << bad.begin << ", " << bad.end << ")";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("attention mass: query 0"), std::string::npos)
          << e.what();
    }
  }
}

}  // namespace
}  // namespace nsa::test
