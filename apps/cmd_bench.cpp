// `nsa bench attention`: time and peak memory of NSA attention forward + backward over a sweep of
// sequence lengths, printed as a table and as JSON lines. On the CPU, "memory" is every byte the
// reference held (inputs, outputs, saved state, scratch) as counted by TrackedAllocator; the ratio
// column compares peak(S)/peak(S0) with S/S0 – linear memory means the two match.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>

#include "commands.h"
#include "config_flags.h"
#include "nsa/attention.h"
#include "nsa/presets.h"

namespace nsa::app {
namespace {

struct BenchArgs {
  std::string device = "cpu";
  std::string preset = "tiny";
  std::vector<int64_t> seq_lens = {1024, 2048, 4096, 8192, 16384};
  int64_t batch = 1;
  bool backward = true;
  std::string json_path;
  ConfigFlags flags;
};

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

void bench_attention(const BenchArgs& a) {
  NSA_CHECK(a.device == "cpu",
            "--device cuda: the CUDA NSA kernels are not part of this build yet; use --device cpu");
  const NsaConfig cfg = apply_config_flags(attention_preset(a.preset), a.flags);
  std::unique_ptr<std::ofstream> json_file;
  if (!a.json_path.empty()) {
    json_file = std::make_unique<std::ofstream>(a.json_path);
    NSA_CHECK(*json_file, "cannot write --json file '", a.json_path, "'");
  }
  std::printf("nsa bench attention --device cpu --config %s: B=%lld %s\n", a.preset.c_str(),
              static_cast<long long>(a.batch), cfg.summary().c_str());
  std::printf("%8s %12s %12s %12s %14s %12s %10s\n", "S", "fwd ms", "bwd ms", "total ms",
              "peak MiB", "bytes/token", "mem ratio");
  double first_peak = 0;
  int64_t first_s = 0;
  for (int64_t S : a.seq_lens) {
    const SeqLayout layout = SeqLayout::batch(a.batch, S);
    const int64_t base = host_memory_stats().current_bytes;
    reset_host_peak();
    double fwd_ms = 0, bwd_ms = 0;
    {
      const NsaTensors<float> in = random_nsa_inputs<float>(cfg, a.batch * S, 1234);
      Tensor<float> d_o({a.batch * S, cfg.heads, cfg.dv}, 1.0f / static_cast<float>(S));
      auto t0 = std::chrono::steady_clock::now();
      const NsaForward<float> fwd = nsa_forward_cpu(cfg, layout, in);
      fwd_ms = ms_since(t0);
      if (a.backward) {
        t0 = std::chrono::steady_clock::now();
        const NsaTensors<float> grads = nsa_backward_cpu(cfg, layout, in, fwd, d_o);
        bwd_ms = ms_since(t0);
      }
    }
    const double peak = static_cast<double>(host_memory_stats().peak_bytes - base);
    if (first_s == 0) first_peak = peak, first_s = S;
    const double ratio = peak / first_peak;
    std::printf("%8lld %12.1f %12.1f %12.1f %14.2f %12.0f %5.2f (S %.0fx)\n",
                static_cast<long long>(S), fwd_ms, bwd_ms, fwd_ms + bwd_ms, peak / (1 << 20),
                peak / static_cast<double>(a.batch * S), ratio,
                static_cast<double>(S) / static_cast<double>(first_s));
    std::ostringstream line;
    line << "{\"bench\":\"attention\",\"device\":\"cpu\",\"config\":\"" << a.preset
         << "\",\"B\":" << a.batch << ",\"S\":" << S << ",\"fwd_ms\":" << fwd_ms
         << ",\"bwd_ms\":" << bwd_ms << ",\"peak_bytes\":" << static_cast<int64_t>(peak)
         << ",\"peak_ratio_vs_first\":" << ratio << "}";
    if (json_file) *json_file << line.str() << "\n";
    std::fflush(stdout);
  }
}

}  // namespace

void register_bench_command(CLI::App& app) {
  CLI::App* bench = app.add_subcommand("bench", "Benchmarks (tables and JSON lines)");
  bench->require_subcommand(1);
  auto args = std::make_shared<BenchArgs>();
  CLI::App* attn = bench->add_subcommand(
      "attention", "NSA attention forward + backward time and peak memory over sequence lengths");
  attn->add_option("--device", args->device, "where to run")->check(CLI::IsMember({"cpu", "cuda"}));
  attn->add_option("--config", args->preset, "attention shape")
      ->check(CLI::IsMember(attention_preset_names()));
  attn->add_option("--seq-lens", args->seq_lens, "sequence lengths")->delimiter(',');
  attn->add_option("--batch", args->batch, "batch size B");
  attn->add_flag("!--no-backward", args->backward, "time the forward only");
  attn->add_option("--json", args->json_path, "also write JSON lines to this file");
  add_config_flags(attn, args->flags, config_field_names());
  attn->callback([args] { bench_attention(*args); });
}

}  // namespace nsa::app
