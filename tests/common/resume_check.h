// Exact resume, the check both trainers (CPU and GPU) must pass: N steps straight vs. k steps,
// stop, resume to N – identical final weights and moments (byte for byte) and identical per-step
// metrics up to the timing fields.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "train/trainer.h"

namespace nsa::test {

// A seconds-long run of a one-layer tiny model on synthetic tokens in `out` (emptied first):
// the run-folder and checkpoint tests start from it.
inline TrainOptions tiny_train_options(const std::filesystem::path& out, int64_t steps) {
  TrainOptions o;
  o.config = std::string(NSA_SOURCE_DIR) + "/configs/tiny.yaml";
  o.overrides = {{"dim", "32"}, {"n_layers", "1"}, {"seq_len", "48"}, {"vocab_size", "64"}};
  o.out_dir = out.string();
  o.steps = steps;
  o.batch = 2;
  o.val_every = 0;
  o.quiet = true;
  o.watchdog_s = 0;
  std::filesystem::remove_all(out);
  return o;
}

inline std::string read_file_bytes(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

// Runs `o` (o.steps steps) in base/straight and as stop_after = k + resume in base/split.
inline void expect_resume_exact(TrainOptions o, const std::filesystem::path& base, int64_t k) {
  namespace fs = std::filesystem;
  fs::remove_all(base);
  o.out_dir = (base / "straight").string();
  train(o);
  o.out_dir = (base / "split").string();
  o.stop_after = k;
  train(o);
  char ckpt[32];
  std::snprintf(ckpt, sizeof(ckpt), "ckpt_%08lld", static_cast<long long>(k));
  EXPECT_TRUE(fs::exists(base / "split" / ckpt / "COMPLETE"));
  o.stop_after = 0;
  o.resume = true;
  train(o);
  std::snprintf(ckpt, sizeof(ckpt), "ckpt_%08lld", static_cast<long long>(o.steps));
  for (const char* file : {"model.safetensors", "optimizer.safetensors"}) {
    EXPECT_EQ(read_file_bytes(base / "straight" / ckpt / file),
              read_file_bytes(base / "split" / ckpt / file))
        << file << " differs after resume";
  }
  std::ifstream a(base / "straight" / "metrics.jsonl"), b(base / "split" / "metrics.jsonl");
  std::string la, lb;
  int64_t lines = 0;
  while (std::getline(a, la) && std::getline(b, lb)) {
    EXPECT_EQ(la.substr(0, la.find(",\"tokens_per_s\"")),
              lb.substr(0, lb.find(",\"tokens_per_s\"")));
    ++lines;
  }
  EXPECT_EQ(lines, o.steps);
}

}  // namespace nsa::test
