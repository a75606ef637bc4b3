// Loss by token position (src/train/position_loss.h): the default and given bucket edges cover
// every position once and bad ones are refused naming --buckets; each bucket averages exactly its
// positions (a stand-in model whose loss is its position); with the real model the mean over all
// positions is nsa eval's loss; the JSON file round-trips and damaged ones are refused naming the
// field; the plot holds one curve per run and marks the windows.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "../common/test_util.h"
#include "nsa/error.h"
#include "train/loss_plot.h"
#include "train/position_loss.h"
#include "train/trainer.h"

namespace nsa::test {
namespace {
namespace fs = std::filesystem;

std::string read_text(const fs::path& p) {
  std::ifstream f(p);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

size_t count_of(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t p = text.find(what); p != std::string::npos; p = text.find(what, p + 1)) ++n;
  return n;
}

// A tiny trained run (3 steps) in `attention` mode; returns its checkpoint.
std::string tiny_run(const fs::path& dir, const std::string& attention) {
  TrainOptions o;
  o.config = std::string(NSA_SOURCE_DIR) + "/configs/tiny.yaml";
  o.overrides = {{"dim", "32"},        {"n_layers", "1"}, {"seq_len", "48"},
                 {"vocab_size", "64"}, {"w", "8"},        {"attention", attention}};
  o.out_dir = dir.string();
  o.steps = 3, o.batch = 2, o.val_every = 3, o.val_batches = 2, o.ckpt_every = 0;
  o.quiet = true;
  fs::remove_all(dir);
  train(o);
  return (dir / "ckpt_00000003").string();
}

TEST(PositionLoss, BucketEdges) {
  using V = std::vector<int64_t>;
  EXPECT_EQ(position_bucket_edges(4096, {}, "--buckets"), (V{0, 512, 1024, 2048, 4096}));
  EXPECT_EQ(position_bucket_edges(3000, {}, "--buckets"), (V{0, 512, 1024, 2048, 3000}));
  EXPECT_EQ(position_bucket_edges(1024, {}, "--buckets"), (V{0, 512, 1024}));
  EXPECT_EQ(position_bucket_edges(300, {}, "--buckets"), (V{0, 300}));
  EXPECT_EQ(position_bucket_edges(2048, {256, 1024}, "--buckets"), (V{0, 256, 1024, 2048}));
  EXPECT_EQ(position_bucket_edges(2048, {0, 100, 2048}, "--buckets"), (V{0, 100, 2048}));
  for (const auto& [bad, says] :
       std::vector<std::pair<V, std::string>>{{{0, 100, 50}, "strictly increasing"},
                                              {{100, 100}, "strictly increasing"},
                                              {{5000}, "edge 5000 is outside [0, 2048]"},
                                              {{-1, 10}, "edge -1 is outside"}}) {
    const std::string e = error_of([&] { position_bucket_edges(2048, bad, "--buckets"); });
    EXPECT_NE(e.find("--buckets"), std::string::npos) << e;
    EXPECT_NE(e.find(says), std::string::npos) << e;
  }
}

// A stand-in model whose loss at a token is its position: every bucket's mean is known.
TEST(PositionLoss, EachBucketAveragesItsPositions) {
  const fs::path dir = fs::temp_directory_path() / "nsa_test_position_loss_buckets";
  const std::string ckpt = tiny_run(dir / "run", "nsa");
  const TokenLossesFn position = [](const ModelConfig&, const ModelParams<float>&,
                                    const SeqLayout& layout, const std::vector<int32_t>&,
                                    const std::vector<int32_t>&) {
    std::vector<double> loss;
    for (int64_t n = 0; n < layout.num_seqs(); ++n) {
      for (int64_t t = 0; t < layout.length(n); ++t) loss.push_back(static_cast<double>(t));
    }
    return loss;
  };
  const PositionLoss r =
      evaluate_loss_by_position(ckpt, "synthetic", 3, 2, 40, {0, 10, 16}, position, "test");
  ASSERT_EQ(r.buckets.size(), 3u);
  const int64_t begin[] = {0, 10, 16}, end[] = {10, 16, 40};
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(r.buckets[i].begin, begin[i]);
    EXPECT_EQ(r.buckets[i].end, end[i]);
    EXPECT_EQ(r.buckets[i].tokens, (end[i] - begin[i]) * 3 * 2);
    EXPECT_DOUBLE_EQ(r.buckets[i].loss, 0.5 * static_cast<double>(begin[i] + end[i] - 1));
  }
  EXPECT_DOUBLE_EQ(r.loss, 19.5);  // the mean position of 0..39
  EXPECT_EQ(r.tokens, 3 * 2 * 40);
  EXPECT_EQ(r.seq_len, 40);
  EXPECT_EQ(r.step, 3);
}

TEST(PositionLoss, MeanIsEvalsLossAndTheFileRoundTrips) {
  const fs::path dir = fs::temp_directory_path() / "nsa_test_position_loss";
  const std::string ckpt = tiny_run(dir / "run", "window");
  const PositionLoss r =
      evaluate_loss_by_position(ckpt, "synthetic", 2, 2, 0, {}, token_losses_cpu, "cpu");
  const EvalResult e = evaluate_checkpoint(ckpt, "synthetic", 2, 2, 0);
  EXPECT_EQ(r.loss, e.loss) << "the same batches, the same model, the same summation";
  EXPECT_EQ(r.seq_len, 48);
  EXPECT_EQ(r.attention, "window");
  EXPECT_EQ(r.w, 8);
  ASSERT_EQ(r.buckets.size(), 1u);  // S = 48 < 512: one bucket
  double weighted = 0;
  int64_t tokens = 0;
  for (const PositionBucket& k : r.buckets) {
    EXPECT_GT(k.loss, 0.0);
    EXPECT_LT(k.loss, 2 * std::log(64.0));  // near ln(vocab) after 3 steps on random tokens
    weighted += k.loss * static_cast<double>(k.tokens);
    tokens += k.tokens;
  }
  EXPECT_EQ(tokens, r.tokens);
  EXPECT_NEAR(weighted / static_cast<double>(tokens), r.loss, 1e-12);
  // Finer buckets of the same evaluation average to the same loss.
  const PositionLoss fine =
      evaluate_loss_by_position(ckpt, "synthetic", 2, 2, 0, {4, 8, 16}, token_losses_cpu, "cpu");
  ASSERT_EQ(fine.buckets.size(), 4u);
  weighted = 0;
  for (const PositionBucket& k : fine.buckets) weighted += k.loss * static_cast<double>(k.tokens);
  EXPECT_NEAR(weighted / static_cast<double>(fine.tokens), r.loss, 1e-12);

  const std::string json = (dir / "lbp.json").string();
  write_position_loss_json(fine, json);
  const PositionLoss back = read_position_loss_json(json);
  EXPECT_EQ(back.checkpoint, ckpt);
  EXPECT_EQ(back.attention, "window");
  EXPECT_EQ(back.step, 3);
  EXPECT_EQ(back.loss, fine.loss);
  ASSERT_EQ(back.buckets.size(), fine.buckets.size());
  for (size_t i = 0; i < back.buckets.size(); ++i) {
    EXPECT_EQ(back.buckets[i].begin, fine.buckets[i].begin);
    EXPECT_EQ(back.buckets[i].end, fine.buckets[i].end);
    EXPECT_EQ(back.buckets[i].tokens, fine.buckets[i].tokens);
    EXPECT_EQ(back.buckets[i].loss, fine.buckets[i].loss);
  }
  // Damaged files: the error names the file and what is wrong.
  const std::string text = read_text(json);
  for (const auto& [from, to, says] :
       std::vector<std::tuple<std::string, std::string, std::string>>{
           {"\"begin\": 4", "\"begin\": 5", "buckets[1]."},
           {"\"format\": \"nsa-loss-by-position\"", "\"format\": \"other\"", "'format'"},
           {"\"version\": 1", "\"version\": 2", "'version'"},
           {"\"seq_len\": 48", "\"seq_len\": 47", "seq_len = 47"},
           {"\"attention\": \"window\"", "\"attention\": 3", "'attention'"}}) {
    std::string damaged = text;
    ASSERT_NE(damaged.find(from), std::string::npos) << from;
    damaged.replace(damaged.find(from), from.size(), to);
    std::ofstream(json) << damaged;
    const std::string e = error_of([&] { read_position_loss_json(json); });
    EXPECT_NE(e.find("lbp.json"), std::string::npos) << e;
    EXPECT_NE(e.find(says), std::string::npos) << e;
  }
  std::ofstream(json) << "{not json";
  EXPECT_NE(error_of([&] { read_position_loss_json(json); }).find("not a JSON object"),
            std::string::npos);
}

TEST(PositionLoss, PlotHasOneCurvePerRunAndMarksTheWindows) {
  const fs::path dir = fs::temp_directory_path() / "nsa_test_position_plot";
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::vector<PositionLoss> runs(3);
  const char* modes[] = {"nsa", "full", "window"};
  for (int i = 0; i < 3; ++i) {
    runs[i].attention = modes[i];
    runs[i].w = 256, runs[i].seq_len = 4096;
    double loss = 3.0 - 0.1 * i;
    for (int64_t b : {0, 512, 1024, 2048}) {
      const int64_t e = b == 0 ? 512 : 2 * b;
      runs[i].buckets.push_back({b, e, e - b, loss});
      loss -= 0.2;
    }
  }
  const std::string svg = (dir / "cmp.svg").string();
  write_position_loss_plot({"run_nsa", "run_full", "run_window"}, runs, svg);
  const std::string text = read_text(svg);
  EXPECT_EQ(count_of(text, "<polyline"), 3u);
  EXPECT_EQ(count_of(text, "<circle"), 12u);  // a marker per bucket
  EXPECT_NE(text.find("run_full (full)"), std::string::npos);
  EXPECT_EQ(count_of(text, "w = 256"), 1u) << "one mark for the one window (full has none)";
  EXPECT_NE(text.find(">4k<"), std::string::npos) << "position ticks as powers of two";
  // Loss curves of several runs: one faint training line and one validation line each.
  LossCurves c;
  c.train = {{1, 4.0}, {2, 3.5}, {3, 3.2}};
  c.val = {{3, 3.3}};
  write_loss_curves_comparison({"a", "b"}, {c, c}, (dir / "curves.svg").string());
  EXPECT_EQ(count_of(read_text(dir / "curves.svg"), "<polyline"), 2u);  // val has 1 point: dots
  EXPECT_EQ(count_of(read_text(dir / "curves.svg"), "<circle"), 2u);
  // A diverged run's losses: tick labels with an exponent, not hundreds of digits.
  LossCurves wild;
  wild.train = {{1, 1e30}, {2, 3.5}, {3, -1e38}};
  write_loss_curves_comparison({"wild"}, {wild}, (dir / "wild.svg").string());
  const std::string wild_text = read_text(dir / "wild.svg");
  EXPECT_NE(wild_text.find("e+37<"), std::string::npos) << wild_text;
  EXPECT_EQ(wild_text.find("0000000000"), std::string::npos) << "a tick label in full digits";
  EXPECT_NE(
      error_of([&] { write_position_loss_plot({"a"}, {PositionLoss{}}, svg); }).find("no points"),
      std::string::npos);
}

}  // namespace
}  // namespace nsa::test
