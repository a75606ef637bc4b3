// GPU timing of NSA attention for `nsa bench attention --device cuda` (built with CUDA only).
#pragma once

#include <cstdint>

#include "nsa/attention.h"

namespace nsa::app {

struct CudaAttentionTiming {
  double fwd_ms = 0, bwd_ms = 0;  // medians over the repetitions
  int64_t device_bytes = 0;  // every device allocation the layer made (it allocates nothing else)
};

// Uploads random inputs for (cfg, B × S), warms up, then times forward and backward with CUDA
// events over `reps` repetitions.
CudaAttentionTiming time_attention_cuda(const NsaConfig& cfg, int64_t batch, int64_t seq_len,
                                        int reps);

}  // namespace nsa::app
