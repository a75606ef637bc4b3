// The needle-retrieval task: sequence layout, determinism, the loader's needle stream, and the
// evaluation's bookkeeping on a (barely trained) checkpoint.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>

#include "data/needle.h"
#include "nsa/error.h"
#include "train/needle_eval.h"
#include "train/token_loader.h"
#include "train/trainer.h"

namespace nsa::test {
namespace {

TEST(Needle, LayoutKeyAndValueAppearTwice) {
  for (const double depth : {0.0, 0.3, 1.0}) {
    const int64_t S = 300;
    const NeedleSequence s = make_needle_sequence(S, depth, 256, 42);
    ASSERT_EQ(static_cast<int64_t>(s.tokens.size()), S);
    const int64_t query_at = S - (1 + kNeedleKeyLen + kNeedleValueLen);
    EXPECT_EQ(s.tokens[s.needle_at], kNeedleMark);
    EXPECT_EQ(s.tokens[query_at], kNeedleQuery);
    EXPECT_EQ(s.value_at, query_at + 1 + kNeedleKeyLen);
    EXPECT_EQ(s.value_at, S - kNeedleValueLen);
    for (int64_t j = 0; j < kNeedleKeyLen; ++j) {
      EXPECT_EQ(s.tokens[s.needle_at + 1 + j], s.tokens[query_at + 1 + j]);
      EXPECT_GE(s.tokens[query_at + 1 + j], kNeedleFirstSymbol);
    }
    for (int64_t j = 0; j < kNeedleValueLen; ++j) {
      EXPECT_EQ(s.tokens[s.needle_at + 1 + kNeedleKeyLen + j], s.tokens[s.value_at + j]);
    }
    // Depth 0 puts the needle first, depth 1 right before the question.
    if (depth == 0.0) {
      EXPECT_EQ(s.needle_at, 0);
    }
    if (depth == 1.0) {
      EXPECT_EQ(s.needle_at + kNeedleSpan, query_at);
    }
    // Everything else is the filler cycle.
    int64_t marks = 0;
    for (int32_t t : s.tokens) marks += t == kNeedleMark;
    EXPECT_EQ(marks, 1);
  }
  EXPECT_EQ(make_needle_sequence(500, -1, 256, 7).tokens,
            make_needle_sequence(500, -1, 256, 7).tokens);
  EXPECT_NE(make_needle_sequence(500, -1, 256, 7).tokens,
            make_needle_sequence(500, -1, 256, 8).tokens);
  EXPECT_THROW(make_needle_sequence(500, 0.5, 20, 1), Error);  // vocabulary too small
  EXPECT_THROW(make_needle_sequence(10, 0.5, 256, 1), Error);  // too short
}

TEST(Needle, RandomDepthDrawsTheEndsAQuarterOfTheTimeEach) {
  const int64_t S = 1000, room = S - 2 * kNeedleSpan;  // the latest needle start
  int64_t first = 0, last = 0, inner = 0, lower_half = 0;
  for (uint64_t seed = 0; seed < 4000; ++seed) {
    const int64_t at = make_needle_sequence(S, -1, 256, seed).needle_at;
    ASSERT_GE(at, 0);
    ASSERT_LE(at, room);
    first += at == 0;
    last += at == room;
    if (at != 0 && at != room) {
      ++inner;
      lower_half += at < room / 2;
    }
  }
  EXPECT_NEAR(first / 4000.0, 0.25, 0.03);
  EXPECT_NEAR(last / 4000.0, 0.25, 0.03);
  EXPECT_NEAR(static_cast<double>(lower_half) / static_cast<double>(inner), 0.5, 0.04);
}

TEST(Needle, RandomFillerHidesTheNeedleAmongSymbols) {
  const int64_t S = 400;
  const NeedleSequence s = make_needle_sequence(S, 0.4, 256, 11, NeedleFiller::kRandom);
  const int64_t query_at = S - kNeedleSpan;
  EXPECT_EQ(s.tokens[s.needle_at], kNeedleMark);
  EXPECT_EQ(s.tokens[query_at], kNeedleQuery);
  EXPECT_TRUE(std::equal(s.tokens.begin() + s.needle_at + 1,
                         s.tokens.begin() + s.needle_at + kNeedleSpan,
                         s.tokens.begin() + query_at + 1));
  // Every other token is a symbol – the key's and value's alphabet – and the filler is not
  // periodic.
  std::vector<int64_t> count(256, 0);
  for (int64_t i = 0; i < S; ++i) {
    if (i == s.needle_at || i == query_at) continue;
    EXPECT_GE(s.tokens[i], kNeedleFirstSymbol) << i;
    ++count[s.tokens[i]];
  }
  EXPECT_GT(std::count_if(count.begin(), count.end(), [](int64_t c) { return c > 0; }), 100);
  EXPECT_NE(s.tokens, make_needle_sequence(S, 0.4, 256, 11).tokens);
  EXPECT_EQ(s.tokens, make_needle_sequence(S, 0.4, 256, 11, NeedleFiller::kRandom).tokens);
  EXPECT_EQ(parse_needle_filler("random", "--filler"), NeedleFiller::kRandom);
  EXPECT_EQ(parse_needle_filler("cycle", "--filler"), NeedleFiller::kCycle);
  try {
    parse_needle_filler("zeros", "--filler");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--filler"), std::string::npos) << e.what();
  }
}

TEST(Needle, MultiNeedleEveryQuestionFollowsItsNeedle) {
  const int64_t S = 900, n = 5;
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    const NeedleSequence s = make_multi_needle_sequence(S, n, 256, seed);
    ASSERT_EQ(static_cast<int64_t>(s.tokens.size()), S);
    std::vector<int64_t> marks, questions;
    for (int64_t i = 0; i < S; ++i) {
      if (s.tokens[i] == kNeedleMark) marks.push_back(i);
      if (s.tokens[i] == kNeedleQuery) questions.push_back(i);
    }
    ASSERT_EQ(static_cast<int64_t>(marks.size()), n);
    ASSERT_EQ(static_cast<int64_t>(questions.size()), n);
    std::vector<bool> asked(n, false);
    for (const int64_t q : questions) {
      int64_t found = -1;  // the needle with this key and value
      for (int64_t i = 0; i < n; ++i) {
        if (std::equal(s.tokens.begin() + marks[i] + 1, s.tokens.begin() + marks[i] + kNeedleSpan,
                       s.tokens.begin() + q + 1))
          found = i;
      }
      ASSERT_GE(found, 0) << "question at " << q << " has no needle";
      EXPECT_FALSE(asked[found]) << "needle " << found << " asked twice";
      asked[found] = true;
      EXPECT_LT(marks[found] + kNeedleSpan, q + 1) << "question before its needle";
    }
    EXPECT_EQ(s.value_at, questions.back() + 1 + kNeedleKeyLen);
    EXPECT_EQ(s.tokens[s.needle_at], kNeedleMark);
  }
  // One needle is the single-needle task at a random depth.
  EXPECT_EQ(make_multi_needle_sequence(300, 1, 256, 9).tokens,
            make_needle_sequence(300, -1, 256, 9).tokens);
  EXPECT_THROW(make_multi_needle_sequence(100, 8, 256, 1), Error);  // no room for 8
  EXPECT_THROW(make_multi_needle_sequence(1000, 0, 256, 1), Error);
}

TEST(Needle, PeriodicRowsRepeatWithAPeriodInRange) {
  for (uint64_t seed = 1; seed <= 30; ++seed) {
    const std::vector<int32_t> t = make_periodic_sequence(1000, 256, seed);
    ASSERT_EQ(t.size(), 1000u);
    int64_t period = 1;  // the smallest p with t[i] = t[i − p] everywhere
    for (; period <= 500; ++period) {
      bool ok = true;
      for (int64_t i = period; i < 1000 && ok; ++i) ok = t[i] == t[i - period];
      if (ok) break;
    }
    EXPECT_GE(period, 16) << "seed " << seed;
    EXPECT_LE(period, 500) << "seed " << seed;
    for (int32_t x : t) EXPECT_GE(x, kNeedleFirstSymbol);
  }
  EXPECT_THROW(make_periodic_sequence(20, 256, 1), Error);
}

TEST(Needle, LoaderRowsAreNeedleSequencesShiftedByOne) {
  TokenLoader loader("needle", "train", 256, 3);
  const Batch b = loader.next(2, 128);
  ASSERT_EQ(b.inputs.size(), 256u);
  for (int64_t r = 0; r < 2; ++r) {
    for (int64_t i = 0; i + 1 < 128; ++i)
      EXPECT_EQ(b.targets[r * 128 + i], b.inputs[r * 128 + i + 1]);
    // The row is tokens [0, 128) of a 129-token sequence: the question mark at 129 − 4 − 4 − 1.
    EXPECT_EQ(b.inputs[r * 128 + 129 - kNeedleValueLen - kNeedleKeyLen - 1], kNeedleQuery);
  }
  EXPECT_THROW(TokenLoader("needle", "train", 20, 3), Error);
  // needle:N: N questions at the end of every row.
  TokenLoader multi("needle:4", "train", 256, 3);
  const Batch m = multi.next(1, 400);
  int64_t questions = 0;
  for (int32_t t : m.inputs) questions += t == kNeedleQuery;
  EXPECT_EQ(questions, 4);
  for (const char* bad : {"needle:0", "needle:x", "needle:", "needle:65", "needle:1000",
                          "needle-mix:0", "needle-mix:"})
    EXPECT_THROW(TokenLoader(bad, "train", 256, 3), Error) << bad;
  // needle-mix:N: even rows needle rows, odd rows periodic copy rows (no marks).
  TokenLoader mixed("needle-mix:2", "train", 256, 3);
  const Batch x = mixed.next(2, 300);
  int64_t q0 = 0, q1 = 0;
  for (int64_t i = 0; i < 300; ++i) {
    q0 += x.inputs[i] == kNeedleQuery;
    q1 += x.inputs[300 + i] == kNeedleQuery || x.inputs[300 + i] == kNeedleMark;
  }
  EXPECT_EQ(q0, 2);
  EXPECT_EQ(q1, 0);
}

TEST(Needle, RowKindsJoinedByPlusTakeTurns) {
  TokenLoader loader("copy+needle-random:2+needle:3", "train", 256, 5);
  const int64_t S = 300;
  const Batch b = loader.next(4, S);
  auto row = [&](int64_t r) {
    std::vector<int32_t> t(b.inputs.begin() + r * S, b.inputs.begin() + (r + 1) * S);
    t.push_back(b.targets[(r + 1) * S - 1]);
    return t;
  };
  EXPECT_EQ(row(0), make_periodic_sequence(S + 1, 256, 5));
  EXPECT_EQ(row(1),
            make_multi_needle_sequence(S + 1, 2, 256, 5 + 7919u, NeedleFiller::kRandom).tokens);
  EXPECT_EQ(row(2), make_multi_needle_sequence(S + 1, 3, 256, 5 + 2 * 7919u).tokens);
  EXPECT_EQ(row(3), make_periodic_sequence(S + 1, 256, 5 + 3 * 7919u));  // the turn wraps
  // The turn runs over the whole stream: with two rows per batch and three kinds, the second
  // batch starts with the third kind (row 2 of the stream) instead of copy again.
  TokenLoader pairs("copy+needle-random:2+needle:3", "train", 256, 5);
  pairs.next(2, S);
  const Batch c = pairs.next(2, S);
  std::vector<int32_t> first(c.inputs.begin(), c.inputs.begin() + S);
  first.push_back(c.targets[S - 1]);
  EXPECT_EQ(first, make_multi_needle_sequence(S + 1, 3, 256, 5 + 2 * 7919u).tokens);
  for (const char* bad : {"copy+", "+copy", "copy+noodle", "copy+needle-random:0", "copy++copy",
                          "needle-random:x", "needle-mix"})
    EXPECT_THROW(TokenLoader(bad, "train", 256, 3), Error) << bad;
  try {
    TokenLoader("copy+noodle", "train", 256, 3);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unknown row kind 'noodle'"), std::string::npos)
        << e.what();
  }
}

// "needle-short": the row starts with a whole single-needle task of a random length L – the
// evaluation's layout at L, its question ending at L – and filler follows; L is log-uniform over
// [1024, S], so the short lengths come up in a long row, and a row no longer than 1024 is one task.
TEST(Needle, ShortTaskRowsHoldAWholeTaskOfARandomLength) {
  const int64_t S = 65537, V = 256;
  int64_t below_4k = 0, above_32k = 0, at_start = 0;
  for (uint64_t seed = 1; seed <= 200; ++seed) {
    for (const NeedleFiller f : {NeedleFiller::kCycle, NeedleFiller::kRandom}) {
      const NeedleSequence s = make_short_needle_sequence(S, V, seed, f);
      ASSERT_EQ(static_cast<int64_t>(s.tokens.size()), S);
      const int64_t L = s.value_at + kNeedleValueLen;  // the task's question ends at L
      ASSERT_GE(L, kNeedleShortMin);
      ASSERT_LE(L, S);
      const NeedleSequence task = make_needle_sequence(L, -1.0, V, seed, f);
      ASSERT_TRUE(std::equal(task.tokens.begin(), task.tokens.end(), s.tokens.begin()));
      EXPECT_EQ(s.needle_at, task.needle_at);
      // After the task, filler only: no marker, no question.
      for (int64_t i = L; i < S; ++i) {
        ASSERT_NE(s.tokens[i], kNeedleMark);
        ASSERT_NE(s.tokens[i], kNeedleQuery);
      }
      below_4k += L < 4096;
      above_32k += L > 32768;
      at_start += s.needle_at == 0;
    }
  }
  // Log-uniform over [1024, 65537]: a third of the draws below 4k, a sixth above 32k (400 draws).
  EXPECT_GT(below_4k, 90);
  EXPECT_LT(below_4k, 180);
  EXPECT_GT(above_32k, 40);
  EXPECT_LT(above_32k, 100);
  EXPECT_GT(at_start, 60);  // depth 0 a quarter of the time
  const NeedleSequence one = make_short_needle_sequence(600, V, 9, NeedleFiller::kRandom);
  EXPECT_EQ(one.value_at + kNeedleValueLen, 600);  // S ≤ 1024: the whole row is the task
  TokenLoader loader("needle-short+needle-random-short", "train", V, 5);
  const Batch b = loader.next(2, 2000);
  std::vector<int32_t> row1(b.inputs.begin() + 2000, b.inputs.end());
  row1.push_back(b.targets.back());
  EXPECT_EQ(row1, make_short_needle_sequence(2001, V, 5 + 7919u, NeedleFiller::kRandom).tokens);
  for (const char* bad : {"needle-short:4", "needle-shorter", "needle-random-short:2"})
    EXPECT_THROW(TokenLoader(bad, "train", V, 3), Error) << bad;
}

// scripts/needle_run.sh spells the first stages' per-batch layout (row r of every batch kind r mod
// 3) as a turn exactly as long as the batch: then the stream turn draws row r of every batch as
// the turn's kind r, batch after batch, each row's content still a function of its stream index.
TEST(Needle, ATurnAsLongAsTheBatchFixesEachBatchRowsKind) {
  TokenLoader loader("copy+needle-random:2+needle:3+copy", "train", 256, 5);
  const int64_t S = 300, B = 4;
  for (int64_t batch = 0; batch < 3; ++batch) {
    const Batch b = loader.next(B, S);
    for (int64_t r = 0; r < B; ++r) {
      std::vector<int32_t> t(b.inputs.begin() + r * S, b.inputs.begin() + (r + 1) * S);
      t.push_back(b.targets[(r + 1) * S - 1]);
      const uint64_t seed = 5 + static_cast<uint64_t>(batch * B + r) * 7919u;
      const std::vector<int32_t> want =
          r % 3 == 0 ? make_periodic_sequence(S + 1, 256, seed)
          : r % 3 == 1
              ? make_multi_needle_sequence(S + 1, 2, 256, seed, NeedleFiller::kRandom).tokens
              : make_multi_needle_sequence(S + 1, 3, 256, seed).tokens;
      EXPECT_EQ(t, want) << "batch " << batch << " row " << r;
    }
  }
}

TEST(Needle, CopyRowsAreAllPeriodic) {
  TokenLoader loader("copy", "train", 256, 3);
  const int64_t S = 200;
  const Batch b = loader.next(3, S);
  for (int64_t r = 0; r < 3; ++r) {
    std::vector<int32_t> row(b.inputs.begin() + r * S, b.inputs.begin() + (r + 1) * S);
    row.push_back(b.targets[(r + 1) * S - 1]);
    EXPECT_EQ(row, make_periodic_sequence(S + 1, 256, 3 + static_cast<uint64_t>(r) * 7919u))
        << "row " << r;
  }
  EXPECT_THROW(TokenLoader("copy", "train", 20, 3), Error);
}

TEST(Needle, RepeatRowsCopyTheirFirstHalf) {
  TokenLoader loader("repeat", "train", 256, 3);
  const int64_t S = 100, half = (S + 2) / 2;
  const Batch b = loader.next(3, S);
  for (int64_t r = 0; r < 3; ++r) {
    std::vector<int32_t> row(b.inputs.begin() + r * S, b.inputs.begin() + (r + 1) * S);
    row.push_back(b.targets[(r + 1) * S - 1]);
    for (int64_t i = 0; i + 1 < S; ++i) EXPECT_EQ(b.targets[r * S + i], row[i + 1]);
    for (int64_t t = half; t <= S; ++t)
      EXPECT_EQ(row[t], row[t - half]) << "row " << r << " t " << t;
  }
}

// Two steps of `tiny` on needle rows of 96 tokens into `dir` (emptied first): a checkpoint to
// evaluate, ckpt_00000002.
TrainOptions two_needle_steps(const std::filesystem::path& dir) {
  std::filesystem::remove_all(dir);
  TrainOptions o;
  o.config = std::string(NSA_SOURCE_DIR) + "/configs/tiny.yaml";
  o.data = "needle";
  o.seq_len = 96;
  o.out_dir = dir.string();
  o.steps = 2;
  o.batch = 2;
  o.val_every = 0;
  o.quiet = true;
  return o;
}

// two_needle_steps trained into a temporary directory `name`; its options (for further runs beside
// it) and its checkpoint.
struct TwoSteps {
  TrainOptions options;
  std::string checkpoint;
};
TwoSteps train_two_needle_steps(const std::string& name) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / name;
  TwoSteps t{two_needle_steps(dir), (dir / "ckpt_00000002").string()};
  train(t.options);
  return t;
}

TEST(Needle, EvaluationCountsEveryCell) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / "nsa_test_needle";
  TrainOptions o = two_needle_steps(dir);
  o.overrides = {{"dim", "32"}, {"n_layers", "1"}};
  train(o);
  const std::vector<NeedleCell> cells =
      evaluate_needle((dir / "ckpt_00000002").string(), {{96, 200}, {0.0, 1.0}, 3});
  ASSERT_EQ(cells.size(), 4u);
  EXPECT_EQ(cells[0].seq_len, 96);
  EXPECT_EQ(cells[3].seq_len, 200);
  EXPECT_EQ(cells[1].depth, 1.0);
  for (const NeedleCell& c : cells) {
    EXPECT_EQ(c.samples, 3);
    EXPECT_LE(c.retrieved, 3);
    EXPECT_LT(c.accuracy(), 0.5);  // two steps of training retrieve nothing (236^4 values)
  }
}

// The probe (--probe): at depth 0 the needle's value tokens lie in the forced block 0 and at
// depth 1 within the window and the forced blocks c − 1, c – selected by every group of every
// layer whatever the weights; in between the counts obey their bounds. The same samples are
// retrieved with and without it.
TEST(Needle, ProbeSeesTheForcedBlocksAndKeepsItsBounds) {
  TwoSteps two = train_two_needle_steps("nsa_test_probe");
  TrainOptions& o = two.options;
  const std::filesystem::path dir = o.out_dir;
  const std::string& ckpt = two.checkpoint;
  const std::vector<double> depths = {0.0, 0.5, 1.0};
  const std::vector<NeedleCell> plain = evaluate_needle(ckpt, {{300}, depths, 3});
  const std::vector<NeedleCell> cells =
      evaluate_needle(ckpt, {{300}, depths, 3, NeedleFiller::kRandom, true});
  const std::vector<NeedleCell> cycle =
      evaluate_needle(ckpt, {{300}, depths, 3, NeedleFiller::kCycle, true});
  ASSERT_EQ(cells.size(), 3u);
  for (size_t i = 0; i < cycle.size(); ++i) EXPECT_EQ(cycle[i].retrieved, plain[i].retrieved);
  for (const NeedleCell& c : cells) {
    ASSERT_EQ(c.selected_any.size(), 2u);  // tiny: two layers
    for (size_t l = 0; l < 2; ++l) {
      EXPECT_LE(c.selected_all[l], c.selected_any[l]);
      EXPECT_LE(c.selected_any[l], c.samples);
      if (c.depth != 0.5) {
        EXPECT_EQ(c.selected_all[l], c.samples) << "depth " << c.depth << " layer " << l;
      }
    }
    EXPECT_LE(c.missed_unselected, c.samples - c.retrieved);
    ASSERT_EQ(c.heads(), 4);            // tiny: four heads
    ASSERT_EQ(c.gate_sum.size(), 24u);  // two layers × four heads × three branches
    ASSERT_EQ(c.gate_sum_missed.size(), 24u);
    for (size_t i = 0; i < 24; ++i) {  // sigmoid gates: each head's in (0, 1)
      EXPECT_GT(c.gate_sum[i], 0.0);
      EXPECT_LT(c.gate_sum[i], static_cast<double>(c.samples));
      EXPECT_LE(c.gate_sum_missed[i], c.gate_sum[i] + 1e-12);
    }
    for (size_t l = 0; l < 2; ++l) {
      for (int b = 0; b < 3; ++b) {  // the head mean is the mean of the heads' means
        double mean = 0;
        for (int64_t h = 0; h < c.heads(); ++h) mean += c.head_gate(l, h, b) / c.heads();
        EXPECT_NEAR(c.gate(l, b), mean, 1e-12);
        EXPECT_NEAR(c.head_gate(l, 1, b), c.gate_sum[(l * 4 + 1) * 3 + b] / c.samples, 1e-12);
        if (c.retrieved == c.samples) {
          EXPECT_EQ(c.gate(l, b, true), 0.0);
        }
      }
    }
  }
  // The CPU model's attention mass on the value tokens: within [0, 1] per branch; at depth 0 they
  // lie in the forced block 0 (every head's selected branch sees them) and not in the window; at
  // depth 1 in the window as well.
  for (const NeedleCell& c : cells) {
    ASSERT_EQ(c.mass_sum.size(), 48u);  // two spans × two layers × four heads × three branches
    ASSERT_EQ(c.weight_sum.size(), 16u);
    for (size_t l = 0; l < 2; ++l) {
      for (int64_t h = 0; h < c.heads(); ++h) {
        for (int b = 0; b < 3; ++b) {
          EXPECT_GE(c.head_mass(l, h, b), 0.0);
          EXPECT_LE(c.head_mass(l, h, b, kValueBlocks), 1.0 + 1e-6);
          // The blocks hold the value tokens: at least their mass, in every branch.
          EXPECT_GE(c.head_mass(l, h, b, kValueBlocks), c.head_mass(l, h, b) - 1e-7)
              << "layer " << l << " head " << h << " branch " << b;
        }
        EXPECT_GT(c.head_mass(l, h, kCmp), 0.0);  // a compressed token covers them at every depth
        if (c.depth == 0.0) {
          EXPECT_GT(c.head_mass(l, h, kSel), 0.0) << "layer " << l << " head " << h;
        }
        if (c.depth != 1.0) {
          EXPECT_EQ(c.head_mass(l, h, kWin), 0.0) << "layer " << l << " head " << h;
        }
        if (c.depth == 1.0) {
          EXPECT_GT(c.head_mass(l, h, kWin), 0.0) << "layer " << l << " head " << h;
        }
        EXPECT_GE(c.needle_weight(l, h), 0.0);  // Σ_c gate_c · mass_c
        EXPECT_LE(c.needle_weight(l, h), 3.0);
        for (size_t span = 0; span < 2; ++span) {
          const size_t i = (span * 2 + l) * 4 + static_cast<size_t>(h);
          EXPECT_LE(c.weight_sum_missed[i], c.weight_sum[i] + 1e-12);
        }
      }
    }
  }
  EXPECT_EQ(cells[0].in_window, 0);  // value tokens at 5..8, the probed row at 295, w = 64
  EXPECT_EQ(cells[1].in_window, 0);
  EXPECT_EQ(cells[2].in_window, 3);  // 9 tokens before the probed row
  EXPECT_EQ(cells[0].missed_unselected, 0);
  // A branch left out is gated off: its gate reads 0 at the probed row.
  o.overrides = {{"branches", "sel,win"}};
  o.out_dir = (dir / "no_cmp").string();
  train(o);
  const std::vector<NeedleCell> no_cmp = evaluate_needle(
      (dir / "no_cmp" / "ckpt_00000002").string(), {{300}, {0.5}, 2, NeedleFiller::kCycle, true});
  for (size_t l = 0; l < 2; ++l) {
    for (int64_t h = 0; h < no_cmp[0].heads(); ++h) {  // every head's, not just their mean
      EXPECT_EQ(no_cmp[0].head_gate(l, h, 0), 0.0);
      EXPECT_GT(no_cmp[0].head_gate(l, h, 1), 0.0);
    }
  }
  // A model whose attention selects nothing has nothing to probe: an error naming --probe.
  o.overrides = {{"branches", "win"}};
  o.out_dir = (dir / "win").string();
  train(o);
  try {
    evaluate_needle((dir / "win" / "ckpt_00000002").string(),
                    {{300}, {0.0}, 1, NeedleFiller::kCycle, true});
    ADD_FAILURE() << "a window-only model was probed";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--probe"), std::string::npos) << e.what();
  }
}

// --n-sel: the same weights attending with more selected blocks. With at least as many as the
// sequence has blocks (tiny: l_sel 32, 300 tokens: 10 blocks), every group of every layer holds
// the needle at every depth; the checkpoint's own n_sel (4) is what 0 gives; fewer than the three
// forced blocks is refused by name.
TEST(Needle, MoreSelectedBlocksAtEvaluationHoldEveryBlock) {
  const std::string ckpt = train_two_needle_steps("nsa_test_n_sel").checkpoint;
  const std::vector<double> depths = {0.25, 0.5, 0.75};
  const std::vector<NeedleCell> all =
      evaluate_needle(ckpt, {{300}, depths, 3, NeedleFiller::kRandom, true, 16});
  for (const NeedleCell& c : all) {
    ASSERT_EQ(c.selected_all.size(), 2u);
    for (size_t l = 0; l < 2; ++l)
      EXPECT_EQ(c.selected_all[l], c.samples) << "depth " << c.depth << " layer " << l;
    EXPECT_EQ(c.missed_unselected, 0);
  }
  const std::vector<NeedleCell> own =
      evaluate_needle(ckpt, {{300}, depths, 3, NeedleFiller::kRandom, true, 0});
  const std::vector<NeedleCell> four =
      evaluate_needle(ckpt, {{300}, depths, 3, NeedleFiller::kRandom, true, 4});
  int64_t held_by_own = 0;
  for (size_t i = 0; i < own.size(); ++i) {
    EXPECT_EQ(own[i].retrieved, four[i].retrieved);
    EXPECT_EQ(own[i].selected_all, four[i].selected_all);
    for (int64_t n : own[i].selected_all) held_by_own += n;
  }
  // 4 of 10 blocks at the probed row (the forced 0, 8, 9 and one free pick of blocks 1–7) cannot
  // hold a middle needle in every group of both layers at all three depths by chance alone.
  EXPECT_LT(held_by_own, 2 * 3 * 3);
  try {
    evaluate_needle(ckpt, {{300}, {0.5}, 1, NeedleFiller::kCycle, false, 2});
    ADD_FAILURE() << "n_sel 2 was taken";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--n-sel"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace nsa::test
