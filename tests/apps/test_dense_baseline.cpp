// The decode benchmark's SDPA baseline on the host side (apps/dense_baseline.h): parsing
// bench/dense_decode.py's JSON lines, finding the script, running a command and reporting its
// failure, and choosing the faster dense attention for the table.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "dense_baseline.h"

namespace nsa::app {
namespace {

const char* kOutput =
    "Warning: some noise on stderr\n"
    "{\"bench\":\"dense_decode\",\"S\":65536,\"B\":1,\"backend\":\"cudnn\",\"layout\":\"packed\","
    "\"ms\":0.31,\"graph\":true}\n"
    "{\"bench\":\"dense_decode\",\"S\":65536,\"B\":1,\"backend\":\"flash\",\"layout\":\"gqa\","
    "\"error\":\"No available kernel\"}\n"
    "{\"bench\":\"dense_decode_best\",\"S\":65536,\"B\":1,\"backend\":\"cudnn\","
    "\"layout\":\"packed\",\"ms\":0.31,\"graph\":true}\n"
    "{\"bench\":\"dense_decode_best\",\"S\":65536,\"B\":16,\"backend\":\"flash\","
    "\"layout\":\"gqa\",\"ms\":2.5,\"graph\":false}\n"
    "{\"bench\":\"dense_decode_best\",\"S\":131072,\"B\":16,\"error\":\"no backend ran this "
    "shape\"}\n"
    "{not json}\n";

TEST(DenseBaseline, ParsesTheBestLinesAndKeepsEveryRecord) {
  const SdpaBaseline b = parse_dense_decode(kOutput);
  ASSERT_EQ(b.best.size(), 2u);
  const SdpaResult one = b.best.at({65536, 1});  // a copy: GCC 13 -Wdangling-reference
  EXPECT_DOUBLE_EQ(one.ms, 0.31);
  EXPECT_EQ(one.backend, "cudnn");
  EXPECT_EQ(one.layout, "packed");
  EXPECT_TRUE(one.graph);
  EXPECT_EQ(b.best.at({65536, 16}).backend, "flash");
  EXPECT_FALSE(b.best.at({65536, 16}).graph);
  EXPECT_EQ(b.best.count({131072, 16}), 0u);
  EXPECT_EQ(b.records.size(), 5u);
  EXPECT_NE(b.note.find("no backend ran this shape"), std::string::npos);
  EXPECT_TRUE(parse_dense_decode("").best.empty());
}

TEST(DenseBaseline, ChoosesTheFasterAndNamesIt) {
  SdpaResult sdpa;
  sdpa.ms = 0.4;
  sdpa.backend = "cudnn";
  EXPECT_EQ(faster_dense(0.6, &sdpa).by, "cudnn");
  EXPECT_DOUBLE_EQ(faster_dense(0.6, &sdpa).ms, 0.4);
  EXPECT_EQ(faster_dense(0.3, &sdpa).by, "ours");
  EXPECT_DOUBLE_EQ(faster_dense(0.3, &sdpa).ms, 0.3);
  EXPECT_EQ(faster_dense(0.3, nullptr).by, "ours");
}

TEST(DenseBaseline, FindsTheScriptBesideTheBuild) {
  namespace fs = std::filesystem;
  const fs::path root = fs::temp_directory_path() / "nsa_dense_baseline_test";
  fs::remove_all(root);
  fs::create_directories(root / "build");
  fs::create_directories(root / "bench");
  std::ofstream(root / "bench" / "dense_decode.py") << "print()\n";
  EXPECT_EQ(find_bench_script("my/script.py", (root / "build").string(), "dense_decode.py"),
            "my/script.py");
  const fs::path saved = fs::current_path();
  fs::current_path(root / "build");  // no bench/ here: found through the binary's folder
  EXPECT_EQ(fs::path(find_bench_script("auto", (root / "build").string(), "dense_decode.py")),
            root / "bench" / "dense_decode.py");
  EXPECT_EQ(find_bench_script("auto", (root / "build" / "bin").string(), "dense_decode.py"), "");
  fs::current_path(root);  // found under the working directory
  EXPECT_EQ(find_bench_script("auto", "", "dense_decode.py"), "bench/dense_decode.py");
  std::string note;  // the benchmarks' notes when a baseline is not run
  EXPECT_EQ(baseline_script("auto", "", "dense_decode.py", "SDPA", "--sdpa-script", &note),
            "bench/dense_decode.py");
  EXPECT_EQ(note, "");
  EXPECT_EQ(baseline_script("off", "", "dense_decode.py", "SDPA", "--sdpa-script", &note), "");
  EXPECT_EQ(note, "SDPA not measured (--sdpa-script off)");
  EXPECT_EQ(baseline_script("auto", "", "missing.py", "dense PyTorch", "--dense-script", &note),
            "");
  EXPECT_EQ(note,
            "dense PyTorch not measured: bench/missing.py not found (run from the source tree or "
            "pass --dense-script)");
  fs::current_path(saved);
  fs::remove_all(root);
}

TEST(DenseBaseline, BuildsAQuotedCommand) {
  SdpaShape s;
  s.layers = 3;
  const std::string cmd = dense_decode_command("python3", "a b/it's.py", {64, 128}, {1}, s);
  EXPECT_EQ(cmd,
            "python3 'a b/it'\\''s.py' --contexts 64,128 --batches 1 --heads 12 --groups 2 "
            "--head-dim 64 --layers 3 --steps 50 --warmup 5");
  s.distinct_layers = true;
  EXPECT_EQ(dense_decode_command("python3", "d.py", {64}, {2}, s),
            "python3 'd.py' --contexts 64 --batches 2 --heads 12 --groups 2 --head-dim 64 "
            "--layers 3 --steps 50 --warmup 5 --distinct-layers");
}

TEST(DenseBaseline, RunsACommandAndReportsFailures) {
  const SdpaBaseline ok = run_dense_decode(
      "printf '%s\\n' '{\"bench\":\"dense_decode_best\",\"S\":64,\"B\":2,\"backend\":\"flash\","
      "\"layout\":\"packed\",\"ms\":1.5}'");
  EXPECT_TRUE(ok.note.empty()) << ok.note;
  ASSERT_EQ(ok.best.count({64, 2}), 1u);
  EXPECT_DOUBLE_EQ(ok.best.at({64, 2}).ms, 1.5);
  const SdpaBaseline bad = run_dense_decode("echo 'ModuleNotFoundError: torch'; exit 3");
  EXPECT_TRUE(bad.best.empty());
  EXPECT_NE(bad.note.find("status 3"), std::string::npos) << bad.note;
  EXPECT_NE(bad.note.find("ModuleNotFoundError: torch"), std::string::npos) << bad.note;
}

}  // namespace
}  // namespace nsa::app
