// Next-token sampling from logits: greedy (temperature 0), temperature, top-k, top-p (nucleus);
// seeded, so a generation is reproducible.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

namespace nsa {

struct SamplerConfig {
  double temperature = 1.0;  // 0: greedy (arg-max, lowest id on ties)
  int64_t top_k = 0;         // 0: off
  double top_p = 1.0;        // 1: off
  uint64_t seed = 1;
};

class Sampler {
 public:
  explicit Sampler(const SamplerConfig& cfg);
  int32_t sample(const std::vector<float>& logits);

 private:
  SamplerConfig cfg_;
  std::mt19937_64 rng_;
};

}  // namespace nsa
