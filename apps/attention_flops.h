// NSA's useful attention FLOPs, the one count behind every TFLOP/s column of the benchmarks.
#pragma once

#include <algorithm>
#include <cstdint>

#include "nsa/config.h"

namespace nsa::app {

// One forward: for every (query, head), 2·(dk + dv) per key it attends to in each branch. The
// backward is counted as 2.5× the forward (recompute of scores plus four products), the
// flash-attention convention.
inline double nsa_forward_flops(const NsaConfig& cfg, int64_t batch, int64_t S) {
  double keys = 0;
  for (int64_t t = 0; t < S; ++t) {
    const int64_t c = t / cfg.l_sel;
    const int64_t blocks = std::min<int64_t>(cfg.n_sel, c + 1);
    keys += static_cast<double>(cfg.num_visible_compressed(t)) +
            static_cast<double>((blocks - 1) * cfg.l_sel + (t - c * cfg.l_sel + 1)) +
            static_cast<double>(std::min(t + 1, cfg.w));
  }
  return 2.0 * static_cast<double>(cfg.dk + cfg.dv) * keys * static_cast<double>(cfg.heads * batch);
}

}  // namespace nsa::app
