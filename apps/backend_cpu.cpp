// The CPU backend: the reference implementation of everything (see backends.h).
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <string>

#include "backends.h"
#include "decode/model_decoder.h"
#include "nsa/error.h"

namespace nsa::app {
namespace {

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

AttentionRun attention_cpu(const NsaConfig& cfg, const SeqLayout& layout,
                           const NsaTensors<float>& in, const Tensor<float>* d_o) {
  AttentionRun r;
  auto t0 = std::chrono::steady_clock::now();
  r.fwd = nsa_forward_cpu(cfg, layout, in);
  r.fwd_ms = ms_since(t0);
  if (d_o) {
    t0 = std::chrono::steady_clock::now();
    r.grads = std::make_unique<NsaTensors<float>>(nsa_backward_cpu(cfg, layout, in, r.fwd, *d_o));
    r.bwd_ms = ms_since(t0);
  }
  return r;
}

// N independent CPU decoders, one per sequence; prefill runs one forward per distinct prompt and
// copies the decoder for a prompt seen before (its state would be the same, bit for bit).
Decoder decoder_cpu(const ModelConfig& cfg, const ModelParams<float>& params, int64_t batch,
                    int64_t max_len) {
  auto decs = std::make_shared<std::vector<ModelDecoder>>();
  for (int64_t i = 0; i < batch; ++i) decs->emplace_back(cfg, params, max_len);
  const int64_t V = cfg.vocab_size;
  Decoder d;
  d.prefill_kind = "one forward per prompt, CPU";
  d.prefill = [decs, V, cfg, &params, max_len](const std::vector<std::vector<int32_t>>& prompts) {
    NSA_CHECK(prompts.size() == decs->size(), "prefill: ", prompts.size(),
              " prompts for a batch of ", decs->size());
    std::vector<ModelDecoder> fresh;
    fresh.reserve(prompts.size());
    std::vector<float> out;
    out.reserve(prompts.size() * static_cast<size_t>(V));
    for (size_t i = 0; i < prompts.size(); ++i) {
      const size_t same = static_cast<size_t>(
          std::find(prompts.begin(), prompts.begin() + i, prompts[i]) - prompts.begin());
      std::vector<float> l;
      if (same < i) {
        fresh.push_back(fresh[same]);
        l.assign(out.begin() + same * V, out.begin() + (same + 1) * V);
      } else {
        fresh.emplace_back(cfg, params, max_len);
        l = fresh.back().prefill(prompts[i]);
      }
      out.insert(out.end(), l.begin(), l.end());
    }
    decs->clear();
    for (ModelDecoder& f : fresh) decs->push_back(std::move(f));
    return out;
  };
  d.step = [decs, V](const std::vector<int32_t>& t) {
    std::vector<float> out;
    out.reserve(t.size() * static_cast<size_t>(V));
    for (size_t i = 0; i < t.size(); ++i) {
      const std::vector<float> l = (*decs)[i].step(t[i]);
      out.insert(out.end(), l.begin(), l.end());
    }
    return out;
  };
  return d;
}

Backend cpu_backend() {
  Backend b;
  b.name = "cpu";
  b.device_count = [] { return 1; };
  b.describe = [] {
    const int n = omp_get_max_threads();
    return "cpu (" + std::to_string(n) + (n == 1 ? " thread)" : " threads)");
  };
  b.train_model = make_train_model_cpu;
  b.logit_rows = [] { return LogitRowsFn(logit_rows_cpu); };
  b.token_losses = [] { return TokenLossesFn(token_losses_cpu); };
  b.decoder = decoder_cpu;
  b.attention = attention_cpu;
  return b;
}

const bool registered = register_backend(cpu_backend());

}  // namespace
}  // namespace nsa::app
