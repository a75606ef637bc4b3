// `nsa bench decode --device cuda`: the whole model's decode step on one GPU, NSA caches against
// dense decoding of the same model, per-step latency and K/V bytes; the attention alone against
// the faster of our dense decode kernel and PyTorch SDPA (bench/dense_decode.py, run in the same
// call); and the batched prefill of prompts (built with CUDA only).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace nsa::app {

struct DecodeBenchArgs {
  std::string model = "configs/m7c_125m.yaml";
  std::vector<int64_t> contexts = {4096, 16384, 65536, 131072};
  std::vector<int64_t> batches = {1, 16};
  int64_t steps = 50, warmup = 5;
  std::string json_path;
  // The SDPA baseline: the script ("auto": bench/dense_decode.py under the working directory or
  // the build's source tree; "off": none) and the interpreter that runs it.
  std::string sdpa_script = "auto", python = "python3";
  // Prefill runs (prompt length, prompts prefilled together), each timed `prefill_reps` times
  // after one untimed run (median).
  std::vector<std::pair<int64_t, int64_t>> prefill = {{65536, 1}, {4096, 16}};
  int64_t prefill_reps = 3;
  // After each NSA attention timing: one more run of the graph with the kernels' phase
  // timestamps on (cuda/nsa/decode_trace.cuh), printed per kernel and phase.
  bool trace = false;
  // The attention alone with caches of its own per layer (n_layers decoders; SDPA's script
  // likewise), as a model's step reads them. Off: one layer's caches called n_layers times, so
  // what fits in L2 can stay there from call to call – on the H200 cuDNN's 64k, B = 1 took 0.164
  // ms that way and 0.192 with caches of its own (docs/perf.md, forty-first session).
  bool distinct_layers = false;
};

void bench_decode_cuda(const DecodeBenchArgs& args);

}  // namespace nsa::app
