// The training benchmark's dense PyTorch baseline on the host side (apps/dense_train_baseline.h):
// parsing bench/dense_model_train.py's JSON lines, which models it can stand in for, the command
// line (and that the script takes every flag of it), and a failed or partial run's note.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "dense_train_baseline.h"

namespace nsa::app {
namespace {

ModelConfig config(const std::string& name, const std::map<std::string, std::string>& set = {}) {
  ModelConfig cfg = load_model_config(std::string(NSA_SOURCE_DIR) + "/configs/" + name + ".yaml");
  for (const auto& [k, v] : set) set_model_field(cfg, k, v);
  cfg.validate();
  return cfg;
}

TEST(DenseTrainBaseline, ParsesTheResultLinesAndKeepsEveryRecord) {
  const DenseTrainBaseline b = parse_dense_train(
      "UserWarning: something on stderr\n"
      "{\"bench\":\"dense_train\",\"S\":2048,\"batch\":32,\"step_ms\":164.18,"
      "\"tokens_per_s\":399177,\"peak_bytes\":29280333824}\n"
      "{\"bench\":\"other\",\"S\":4096}\n"
      "{\"bench\":\"dense_train\",\"S\":8192,\"batch\":8,\"step_ms\":220.67,"
      "\"tokens_per_s\":296991,\"peak_bytes\":29303533568}\n"
      "{\"bench\":\"dense_train\",\"S\":16384}\n"  // no result: not counted
      "{broken\n");
  ASSERT_EQ(b.by_len.size(), 2u);
  const DenseTrainResult r = b.by_len.at(2048);  // a copy: GCC 13 -Wdangling-reference
  EXPECT_EQ(r.batch, 32);
  EXPECT_DOUBLE_EQ(r.step_ms, 164.18);
  EXPECT_DOUBLE_EQ(r.tokens_per_s, 399177);
  EXPECT_DOUBLE_EQ(r.peak_bytes, 29280333824.0);
  EXPECT_DOUBLE_EQ(b.by_len.at(8192).tokens_per_s, 296991);
  EXPECT_EQ(b.records.size(), 4u);
  EXPECT_TRUE(parse_dense_train("").by_len.empty());
}

TEST(DenseTrainBaseline, NamesWhatTheScriptCannotModel) {
  EXPECT_EQ(dense_train_mismatch(config("m7c_125m")), "");
  EXPECT_EQ(dense_train_mismatch(config("tiny", {{"attention", "full"}})), "");
  EXPECT_NE(dense_train_mismatch(config("tiny", {{"tie_embeddings", "false"}})).find("tied"),
            std::string::npos);
  EXPECT_NE(dense_train_mismatch(config("tiny", {{"mlp", "silu"}})).find("'silu'"),
            std::string::npos);
  const std::string dims = dense_train_mismatch(config("tiny", {{"dv", "32"}}));
  EXPECT_NE(dims.find("dk 16"), std::string::npos) << dims;
  EXPECT_NE(dims.find("dv 32"), std::string::npos) << dims;
}

TEST(DenseTrainBaseline, BuildsTheModelsCommandAndTheScriptTakesEveryFlag) {
  const ModelConfig cfg = config("m7c_125m", {{"vocab_size", "256"}});
  const std::string cmd =
      dense_train_command("python3", "bench/it's.py", cfg, {2048, 65536}, 65536, 5, 2);
  EXPECT_EQ(cmd,
            "python3 'bench/it'\\''s.py' --seq-lens 2048,65536 --tokens-per-step 65536 --steps 5 "
            "--warmup 2 --dim 768 --layers 12 --heads 12 --groups 2 --head-dim 64 --vocab 256 "
            "--hidden 2048 --rope-base 10000 --norm-eps 1e-05");
  std::ifstream in(std::string(NSA_SOURCE_DIR) + "/bench/dense_model_train.py");
  std::stringstream script;
  script << in.rdbuf();
  std::istringstream words(cmd);
  int flags = 0;
  for (std::string w; words >> w;) {
    if (w.rfind("--", 0) != 0) continue;
    ++flags;
    EXPECT_NE(script.str().find("add_argument(\"" + w + "\""), std::string::npos)
        << "bench/dense_model_train.py does not take " << w;
  }
  EXPECT_EQ(flags, 13);
}

TEST(DenseTrainBaseline, ReportsAFailedOrPartialRun) {
  const DenseTrainBaseline some = run_dense_train(
      "printf '%s\\n' '{\"bench\":\"dense_train\",\"S\":64,\"batch\":2,\"step_ms\":1.5,"
      "\"tokens_per_s\":85.3}'",
      {64, 128});
  ASSERT_EQ(some.by_len.count(64), 1u);
  EXPECT_DOUBLE_EQ(some.by_len.at(64).tokens_per_s, 85.3);
  EXPECT_NE(some.note.find("no result for S = 128"), std::string::npos) << some.note;
  const DenseTrainBaseline all = run_dense_train(
      "printf '%s\\n' '{\"bench\":\"dense_train\",\"S\":64,\"batch\":2,\"step_ms\":1.5,"
      "\"tokens_per_s\":85.3}'",
      {64});
  EXPECT_TRUE(all.note.empty()) << all.note;
  const DenseTrainBaseline bad =
      run_dense_train("echo 'torch.OutOfMemoryError: CUDA out of memory'; exit 1", {64});
  EXPECT_TRUE(bad.by_len.empty());
  EXPECT_NE(bad.note.find("status 1"), std::string::npos) << bad.note;
  EXPECT_NE(bad.note.find("CUDA out of memory"), std::string::npos) << bad.note;
}

}  // namespace
}  // namespace nsa::app
