// GPU timing of NSA attention for `nsa bench attention --device cuda` (built with CUDA only).
#pragma once

#include <cstdint>

#include "nsa/attention.h"

namespace nsa::app {

struct CudaAttentionTiming {
  double fwd_ms = 0, bwd_ms = 0;              // medians over the repetitions, launched eagerly
  double graph_fwd_ms = 0, graph_bwd_ms = 0;  // the same, each pass replayed from a CUDA graph
  double host_ms = 0;  // median host time to issue both passes eagerly (launches, not waiting)
  int64_t device_bytes = 0;  // every device allocation the layer made (it allocates nothing else)
};

// Uploads random inputs for (cfg, B × S), warms up, then times forward and backward with CUDA
// events over `reps` repetitions: launched call by call, then each pass captured once into a CUDA
// graph and replayed.
CudaAttentionTiming time_attention_cuda(const NsaConfig& cfg, int64_t batch, int64_t seq_len,
                                        int reps);

}  // namespace nsa::app
