// Where a decode step's time goes, kernel by kernel: the GPU decoder's step (its CUDA graph, with
// the programmatic dependent launches that let kernels overlap) replayed under CUPTI's kernel
// activity trace, which stamps every kernel's start and end on the GPU. A kernel's "own" time is
// its end minus the end of the kernel before it in the step: what it adds to the chain, whatever it
// did while waiting for its predecessor. Medians over the replayed steps, per position in the step,
// then summed per kernel name. Random weights and caches (the cost does not depend on values).
//   nsa_decode_timeline [--model configs/m7c_125m.yaml] [--context 65536] [--batch 1]
//                       [--steps 30] [--dense]
#include <cuda_runtime.h>
#include <cupti.h>
#include <cxxabi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "cuda/common/cuda_check.h"
#include "decode/cuda/model_decoder_cuda.h"
#include "model/model_params.h"
#include "nsa/model_config.h"

namespace {

struct KernelSpan {
  uint64_t start, end;
  std::string name;
};
std::vector<KernelSpan> g_spans;

#define CUPTI_CHECK(call)                                                                   \
  do {                                                                                      \
    CUptiResult r_ = (call);                                                                \
    if (r_ != CUPTI_SUCCESS) {                                                              \
      const char* s_ = nullptr;                                                             \
      cuptiGetResultString(r_, &s_);                                                        \
      std::fprintf(stderr, "CUPTI error %s at %s:%d\n", s_ ? s_ : "?", __FILE__, __LINE__); \
      std::exit(1);                                                                         \
    }                                                                                       \
  } while (0)

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *size = 8 << 20;
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, *size));
  *max_records = 0;
}

// A kernel's name, demangled, without its namespaces, return type and parameters (template
// arguments kept: they tell the variants apart), at most 44 characters.
std::string short_name(const char* mangled) {
  int status = 0;
  char* d = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
  std::string s = status == 0 && d ? d : (mangled ? mangled : "?");
  std::free(d);
  for (size_t at; (at = s.find("(anonymous namespace)::")) != std::string::npos;)
    s.erase(at, std::strlen("(anonymous namespace)::"));
  if (s.rfind("void ", 0) == 0) s.erase(0, 5);
  const size_t paren = s.find('(');
  if (paren != std::string::npos) s.erase(paren);
  const size_t angle = s.find('<');
  const size_t colon = s.rfind("::", angle == std::string::npos ? s.size() : angle);
  if (colon != std::string::npos) s.erase(0, colon + 2);
  return s.size() > 44 ? s.substr(0, 44) : s;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  CUpti_Activity* record = nullptr;
  while (cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
    if (record->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) continue;
    const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
    g_spans.push_back({k->start, k->end, short_name(k->name)});
  }
  std::free(buffer);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  std::string model = "configs/m7c_125m.yaml";
  int64_t S = 65536, B = 1, steps = 30;
  bool dense = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "nsa_decode_timeline: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--model") {
      model = next();
    } else if (a == "--context") {
      S = std::stoll(next());
    } else if (a == "--batch") {
      B = std::stoll(next());
    } else if (a == "--steps") {
      steps = std::stoll(next());
    } else if (a == "--dense") {
      dense = true;
    } else {
      std::fprintf(stderr,
                   "nsa_decode_timeline: unknown flag %s (--model, --context, --batch, --steps, "
                   "--dense)\n",
                   a.c_str());
      return 2;
    }
  }
  const nsa::ModelConfig cfg = nsa::load_model_config(model);
  const nsa::ModelParams<float> params = nsa::init_model_params<float>(cfg);
  const int64_t warmup = 5;
  nsa::cuda::ModelDecoderCuda dec(cfg, params, B, S + warmup + steps + 1, dense);
  dec.fill_random(S, 11);
  for (int64_t i = 0; i < warmup; ++i) dec.step_async();
  NSA_CUDA_CHECK(cudaStreamSynchronize(dec.stream()));

  CUPTI_CHECK(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed));
  CUPTI_CHECK(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL));
  for (int64_t i = 0; i < steps; ++i) dec.step_async();
  NSA_CUDA_CHECK(cudaStreamSynchronize(dec.stream()));
  CUPTI_CHECK(cuptiActivityFlushAll(1));
  CUPTI_CHECK(cuptiActivityDisable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL));

  std::sort(g_spans.begin(), g_spans.end(),
            [](const KernelSpan& a, const KernelSpan& b) { return a.start < b.start; });
  if (g_spans.empty() || g_spans.size() % static_cast<size_t>(steps) != 0) {
    std::fprintf(stderr, "nsa_decode_timeline: %zu kernel records for %lld steps\n", g_spans.size(),
                 static_cast<long long>(steps));
    return 1;
  }
  const size_t per = g_spans.size() / static_cast<size_t>(steps);
  // Per position in the step: the median start (from the step's first start), duration and own
  // time (end − the previous kernel's end; the first kernel: its duration). Steps after the first
  // only, so that every position has a predecessor in the same replay stream.
  std::vector<std::vector<double>> at(per), dur(per), own(per);
  std::vector<double> step_us;
  for (int64_t s = 1; s < steps; ++s) {
    const KernelSpan* k = &g_spans[static_cast<size_t>(s) * per];
    uint64_t end = g_spans[static_cast<size_t>(s) * per - 1].end;
    for (size_t i = 0; i < per; ++i) {
      at[i].push_back((k[i].start - k[0].start) * 1e-3);
      dur[i].push_back((k[i].end - k[i].start) * 1e-3);
      own[i].push_back((static_cast<double>(k[i].end) - static_cast<double>(end)) * 1e-3);
      end = std::max(end, k[i].end);
    }
    step_us.push_back((k[per - 1].end - g_spans[static_cast<size_t>(s) * per - 1].end) * 1e-3);
  }
  std::printf("nsa_decode_timeline: %s, context %lld, B %lld, %s, %lld steps, %zu kernels a step\n",
              model.c_str(), static_cast<long long>(S), static_cast<long long>(B),
              dense ? "dense" : "nsa", static_cast<long long>(steps), per);
  std::printf("median step (end to end) %.1f us\n", median(step_us));
  std::printf("%4s %-44s %9s %9s %9s\n", "#", "kernel", "start us", "dur us", "own us");
  std::map<std::string, std::pair<double, int>> by_name;
  for (size_t i = 0; i < per; ++i) {
    const std::string& name = g_spans[per + i].name;
    const double o = median(own[i]);
    by_name[name].first += o;
    by_name[name].second += 1;
    if (i < 24 || i + 8 >= per)  // the embedding, two layers, and the step's tail
      std::printf("%4zu %-44s %9.2f %9.2f %9.2f\n", i, name.c_str(), median(at[i]), median(dur[i]),
                  o);
  }
  std::printf("\nown time per kernel name, summed over the step (medians):\n");
  double total = 0;
  for (const auto& [name, v] : by_name) {
    std::printf("  %-44s %4d x  %8.1f us\n", name.c_str(), v.second, v.first);
    total += v.first;
  }
  std::printf("  %-44s         %8.1f us\n", "total", total);
  return 0;
}
