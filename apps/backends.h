// The one place the commands choose where work runs: a registry of backends by --device name.
// backend_cpu.cpp registers the CPU reference; backend_cuda.cpp, compiled only when the build has
// the CUDA toolkit, registers the GPU. Commands ask for a backend by name and never test build
// flags; asking for one this build lacks throws the one "no CUDA backend" message.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "bench_attention_cuda.h"
#include "bench_decode_cuda.h"
#include "bench_train_cuda.h"
#include "model/model_params.h"
#include "nsa/attention.h"
#include "train/needle_eval.h"
#include "train/position_loss.h"
#include "train/train_model.h"

namespace nsa::app {

// One decode step of N sequences: tokens [N] → logits [N·V].
using DecodeStep = std::function<std::vector<float>(const std::vector<int32_t>&)>;
// A decoder of N sequences: prefill feeds one whole prompt per sequence to the fresh decoder and
// returns the logits after each prompt's last token [N·V] (the GPU in one batched forward, the
// CPU in one forward per distinct prompt); step then decodes on (docs/inference.md).
struct Decoder {
  std::function<std::vector<float>(const std::vector<std::vector<int32_t>>&)> prefill;
  DecodeStep step;
  std::string prefill_kind;  // how prefill runs, for the user
};

// NSA attention forward, and the backward when `d_o` is given (then `grads` is set).
struct AttentionRun {
  NsaForward<float> fwd;
  std::unique_ptr<NsaTensors<float>> grads;
  double fwd_ms = 0, bwd_ms = 0;  // wall time, host to host
  size_t device_bytes = 0;        // what a device backend allocated (0 on the CPU)
};

struct Backend {
  std::string name;                       // the --device value: "cpu", "cuda"
  std::function<int()> device_count;      // usable devices (0: none; the CPU has 1)
  std::function<std::string()> describe;  // "cpu (2 threads)", the GPU's name and memory
  TrainModelFactory train_model;          // nsa train, nsa diagnose --model
  LogitRowsFactory logit_rows;            // nsa eval --task needle: one evaluator per command
  TokenLossesFactory token_losses;        // nsa eval --by-position: one evaluator per command
  std::function<Decoder(const ModelConfig& cfg, const ModelParams<float>& params, int64_t batch,
                        int64_t max_len)>
      decoder;  // nsa generate
  std::function<AttentionRun(const NsaConfig& cfg, const SeqLayout& layout,
                             const NsaTensors<float>& in, const Tensor<float>* d_o)>
      attention;  // nsa attention, nsa diagnose
  // GPU benchmarks (unset on the CPU, which has its own loops in cmd_bench.cpp).
  std::function<CudaAttentionTiming(const NsaConfig&, int64_t batch, int64_t seq_len, int reps)>
      time_attention;
  std::function<void(const DecodeBenchArgs&)> bench_decode;
  std::function<void(const TrainBenchArgs&)> bench_train;
};

// Adds a backend to the registry (at static initialisation; returns true).
bool register_backend(Backend backend);
// The backend named `device`; "auto" is the GPU when this build has one and a device is usable,
// else the CPU. Throws nsa::Error naming `command` when this build has no such backend. Callers
// copy the result (a few std::functions) rather than bind a reference: GCC 13 warns
// (-Wdangling-reference) when a reference is bound to a call whose arguments are temporaries.
const Backend& backend(const std::string& device, const std::string& command);
// The backend named `name`, or nullptr when this build has none.
const Backend* find_backend(const std::string& name);

}  // namespace nsa::app
