// `nsa bench decode --device cuda`: the whole model's decode step on one GPU, NSA caches against
// dense decoding of the same model, per-step latency and K/V bytes (built with CUDA only).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace nsa::app {

struct DecodeBenchArgs {
  std::string model = "configs/m7c_125m.yaml";
  std::vector<int64_t> contexts = {4096, 16384, 65536, 131072};
  std::vector<int64_t> batches = {1, 16};
  int64_t steps = 50, warmup = 5;
  std::string json_path;
};

void bench_decode_cuda(const DecodeBenchArgs& args);

}  // namespace nsa::app
