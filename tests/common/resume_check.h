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
