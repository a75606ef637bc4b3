// `nsa bench train`: training throughput of the whole model on one GPU (built with CUDA only).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "nsa/recompute.h"

namespace nsa::app {

struct TrainBenchArgs {
  std::string config = "configs/m7c_125m.yaml";
  std::map<std::string, std::string> overrides = {{"vocab_size", "256"}};  // the byte vocabulary
  std::vector<int64_t> seq_lens = {2048, 8192, 16384, 32768, 65536};
  int64_t tokens_per_step = 65536;  // batch = max(1, tokens_per_step / S)
  int64_t steps = 5, warmup = 2;
  Recompute recompute = Recompute::kNone;
  bool breakdown = true;  // after the timed steps, `steps` more with phase timing (bench_phases.h)
  // The dense PyTorch baseline run first in the same call (dense_train_baseline.h): "auto"
  // (bench/dense_model_train.py), a path, or "off"; and its interpreter.
  std::string dense_script = "auto", python = "python3";
  std::string json_path;
};

void bench_train_cuda(const TrainBenchArgs& args);

}  // namespace nsa::app
