// `nsa bench attention`: time and peak memory of NSA attention forward + backward over a sweep of
// sequence lengths, printed as a table and as JSON lines. On the CPU, "memory" is every byte the
// reference held (inputs, outputs, saved state, scratch) as counted by TrackedAllocator; the ratio
// column compares peak(S)/peak(S0) with S/S0 – linear memory means the two match.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "attention_flops.h"
#include "backends.h"
#include "bench_json.h"
#include "commands.h"
#include "config_flags.h"
#include "cpu/attend_row.h"
#include "decode/nsa_decode_cache.h"
#include "nsa/attention.h"
#include "nsa/error.h"
#include "nsa/presets.h"
#include "nsa/recompute.h"

namespace nsa::app {
namespace {

struct BenchArgs {
  std::string device = "cpu";
  std::string preset = "tiny";
  std::vector<int64_t> seq_lens = {1024, 2048, 4096, 8192, 16384};
  int64_t batch = 1;
  bool backward = true;
  std::string json_path;
  int reps = 3;
  double max_seconds = 0;
  ConfigFlags flags;
};

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

struct Timing {
  double fwd_ms = 0, bwd_ms = 0;
  double graph_ms = 0;  // GPU: forward + backward replayed from CUDA graphs (0 on the CPU)
  double host_ms = 0;   // GPU: host time to issue both passes eagerly
  double peak_bytes = 0;
};

Timing time_cpu(const NsaConfig& cfg, const BenchArgs& a, int64_t S) {
  const SeqLayout layout = SeqLayout::batch(a.batch, S);
  const int64_t base = host_memory_stats().current_bytes;
  reset_host_peak();
  Timing out;
  {
    const NsaTensors<float> in = random_nsa_inputs<float>(cfg, a.batch * S, 1234);
    Tensor<float> d_o({a.batch * S, cfg.heads, cfg.dv}, 1.0f / static_cast<float>(S));
    auto t0 = std::chrono::steady_clock::now();
    const NsaForward<float> fwd = nsa_forward_cpu(cfg, layout, in);
    out.fwd_ms = ms_since(t0);
    if (a.backward) {
      t0 = std::chrono::steady_clock::now();
      const NsaTensors<float> grads = nsa_backward_cpu(cfg, layout, in, fwd, d_o);
      out.bwd_ms = ms_since(t0);
    }
  }
  out.peak_bytes = static_cast<double>(host_memory_stats().peak_bytes - base);
  return out;
}

void bench_attention(const BenchArgs& a) {
  const bool gpu = a.device == "cuda";
  const Backend device =
      backend(a.device, "nsa bench attention");  // a copy: no reference to a call on temporaries
  check_finite_non_negative("--max-seconds", a.max_seconds, " (0: never stop the sweep)");
  const NsaConfig cfg = apply_config_flags(attention_preset(a.preset), a.flags);
  const std::unique_ptr<std::ofstream> json_file = open_json_lines(a.json_path);
  std::printf("nsa bench attention --device %s --config %s: B=%lld %s\n", a.device.c_str(),
              a.preset.c_str(), static_cast<long long>(a.batch), cfg.summary().c_str());
  std::printf("%8s %10s %10s %10s %9s %12s %11s %10s%s\n", "S", "fwd ms", "bwd ms", "total ms",
              "TFLOP/s", "peak MiB", "bytes/token", "mem ratio",
              gpu ? "   graph ms: fwd + bwd = total (host ms to issue eagerly)" : "");
  double first_peak = 0;
  int64_t first_s = 0;
  for (int64_t S : a.seq_lens) {
    Timing tm;
    char graph_col[96] = "";
    if (gpu) {
      const CudaAttentionTiming c = device.time_attention(cfg, a.batch, S, a.reps);
      tm.fwd_ms = c.fwd_ms, tm.bwd_ms = c.bwd_ms;
      tm.graph_ms = c.graph_fwd_ms + c.graph_bwd_ms;
      tm.host_ms = c.host_ms;
      tm.peak_bytes = static_cast<double>(c.device_bytes);
      std::snprintf(graph_col, sizeof graph_col, "   %.2f + %.2f = %.2f (eager issue %.2f)",
                    c.graph_fwd_ms, c.graph_bwd_ms, tm.graph_ms, c.host_ms);
    } else {
      tm = time_cpu(cfg, a, S);
    }
    if (first_s == 0) first_peak = tm.peak_bytes, first_s = S;
    const double ratio = tm.peak_bytes / first_peak;
    const double flops = nsa_forward_flops(cfg, a.batch, S) * (a.backward ? 3.5 : 1.0);
    const double tflops = flops / ((tm.fwd_ms + tm.bwd_ms) * 1e-3) / 1e12;
    std::printf("%8lld %10.2f %10.2f %10.2f %9.2f %12.2f %11.0f %5.2f (S %.0fx)%s\n",
                static_cast<long long>(S), tm.fwd_ms, tm.bwd_ms, tm.fwd_ms + tm.bwd_ms, tflops,
                tm.peak_bytes / (1 << 20), tm.peak_bytes / static_cast<double>(a.batch * S), ratio,
                static_cast<double>(S) / static_cast<double>(first_s), graph_col);
    std::ostringstream line;
    line << "{\"bench\":\"attention\",\"device\":\"" << a.device << "\",\"config\":\"" << a.preset
         << "\",\"B\":" << a.batch << ",\"S\":" << S << ",\"fwd_ms\":" << tm.fwd_ms
         << ",\"bwd_ms\":" << tm.bwd_ms << ",\"tflops\":" << tflops;
    if (gpu) line << ",\"graph_ms\":" << tm.graph_ms << ",\"host_issue_ms\":" << tm.host_ms;
    line << ",\"peak_bytes\":" << static_cast<int64_t>(tm.peak_bytes)
         << ",\"peak_ratio_vs_first\":" << ratio << "}";
    if (json_file) *json_file << line.str() << "\n" << std::flush;
    std::fflush(stdout);
    if (a.max_seconds > 0 && (tm.fwd_ms + tm.bwd_ms) * 1e-3 > a.max_seconds) {
      std::printf("(stopping the sweep: one pass took longer than --max-seconds %.0f)\n",
                  a.max_seconds);
      break;
    }
  }
}

struct DecodeArgs {
  std::string device = "cpu";
  std::string preset = "m7c_125m";
  std::vector<int64_t> contexts = {4096, 16384, 65536};
  int64_t steps = 8;
  std::string json_path;
};

// One attention layer's decode step at context S (CPU): NSA through NsaDecodeCache after a batched
// prefill, against dense attention over all S keys, with the K/V bytes each reads. The paper's
// access model: (S − l)/d + n_sel·l_sel + w tokens per group for NSA, S for dense.
void bench_decode(const DecodeArgs& a) {
  const NsaConfig cfg = attention_preset(a.preset);
  const int64_t G = cfg.groups, H = cfg.heads, dk = cfg.dk, dv = cfg.dv;
  const double row_bytes = static_cast<double>(G * (dk + dv) * sizeof(float));
  const std::unique_ptr<std::ofstream> json = open_json_lines(a.json_path);
  std::printf("nsa bench decode --device cpu --config %s (one attention layer, fp32): %s\n",
              a.preset.c_str(), cfg.summary().c_str());
  std::printf("%8s %12s %12s %8s %13s %13s %7s %13s\n", "context", "NSA ms/step", "dense ms/step",
              "speedup", "NSA KiB/step", "formula KiB", "ratio", "dense KiB");
  for (int64_t S : a.contexts) {
    const int64_t T = S + a.steps;
    const NsaTensors<float> in = random_nsa_inputs<float>(cfg, T, 5);
    Tensor<float> k[kNumBranches], v[kNumBranches];
    for (int b = 0; b < kNumBranches; ++b) {
      if (cfg.kv_index(b) != b) continue;
      k[b] = Tensor<float>({S, G, dk});
      v[b] = Tensor<float>({S, G, dv});
      std::copy_n(in.k[b].ptr(), S * G * dk, k[b].ptr());
      std::copy_n(in.v[b].ptr(), S * G * dv, v[b].ptr());
    }
    NsaDecodeCache cache(cfg);
    cache.prefill(k, v, &in.phi_k, &in.phi_v);
    std::vector<float> o(H * dv), probs(T);
    std::vector<int32_t> sel(G * cfg.n_sel);
    std::vector<double> nsa_ms, dense_ms;
    for (int64_t t = S; t < T; ++t) {
      const float* kp[kNumBranches];
      const float* vp[kNumBranches];
      const float* gp[kNumBranches];
      for (int b = 0; b < kNumBranches; ++b) {
        kp[b] = in.k[cfg.kv_index(b)].ptr() + t * G * dk;
        vp[b] = in.v[cfg.kv_index(b)].ptr() + t * G * dv;
        gp[b] = in.gate[b].ptr() + t * H;
      }
      auto t0 = std::chrono::steady_clock::now();
      cache.step(in.q.ptr() + t * H * dk, kp, vp, gp, &in.phi_k, &in.phi_v, o.data(), sel.data());
      nsa_ms.push_back(ms_since(t0));
      t0 = std::chrono::steady_clock::now();
      const cpu::KeyRange all{0, t + 1};
      for (int64_t h = 0; h < H; ++h) {
        const int64_t g = h / (H / G);
        const cpu::RowKv<float> kv{in.k[cfg.kv_index(kSel)].ptr() + g * dk,
                                   in.v[cfg.kv_index(kSel)].ptr() + g * dv, G * dk, G * dv};
        cpu::attend_row_forward(in.q.ptr() + (t * H + h) * dk, kv, &all, 1, dk, dv,
                                static_cast<float>(cfg.softmax_scale()), o.data() + h * dv,
                                probs.data());
      }
      dense_ms.push_back(ms_since(t0));
    }
    std::sort(nsa_ms.begin(), nsa_ms.end());
    std::sort(dense_ms.begin(), dense_ms.end());
    const double nsa = nsa_ms[nsa_ms.size() / 2], dense = dense_ms[dense_ms.size() / 2];
    const int64_t t = T - 1;
    const double formula_tokens = static_cast<double>(cfg.num_visible_compressed(t)) +
                                  static_cast<double>(cfg.n_sel * cfg.l_sel) +
                                  static_cast<double>(std::min(cfg.w, t + 1));
    const double nsa_bytes = static_cast<double>(cache.last_step_kv_bytes());
    const double formula = formula_tokens * row_bytes, dense_bytes = (t + 1) * row_bytes;
    std::printf("%8lld %12.3f %12.3f %7.1fx %13.1f %13.1f %7.3f %13.1f\n",
                static_cast<long long>(S), nsa, dense, dense / nsa, nsa_bytes / 1024,
                formula / 1024, nsa_bytes / formula, dense_bytes / 1024);
    if (json) {
      *json << "{\"bench\":\"decode\",\"device\":\"cpu\",\"config\":\"" << a.preset
            << "\",\"context\":" << S << ",\"nsa_ms\":" << nsa << ",\"dense_ms\":" << dense
            << ",\"nsa_kv_bytes\":" << nsa_bytes << ",\"formula_kv_bytes\":" << formula
            << ",\"dense_kv_bytes\":" << dense_bytes << "}\n";
    }
    std::fflush(stdout);
  }
}

// --prefill LENxCOUNT,...: prompt length and prompts per run; "none" alone: no runs.
std::vector<std::pair<int64_t, int64_t>> parse_prefill_runs(const std::vector<std::string>& specs) {
  std::vector<std::pair<int64_t, int64_t>> runs;
  if (specs.size() == 1 && specs[0] == "none") return runs;
  for (const std::string& spec : specs) {
    const size_t x = spec.find('x');
    int64_t len = 0, count = 0;
    size_t used_len = 0, used_count = 0;
    try {
      if (x != std::string::npos) {
        len = std::stoll(spec.substr(0, x), &used_len);
        count = std::stoll(spec.substr(x + 1), &used_count);
      }
    } catch (const std::exception&) {
      len = count = 0;
    }
    NSA_CHECK(x != std::string::npos && used_len == x && used_count == spec.size() - x - 1 &&
                  len >= 1 && len < (int64_t{1} << 31) - 1 && count >= 1 && count <= 4096,
              "--prefill: '", spec,
              "' is not LENxCOUNT (a prompt length in [1, 2^31 − 1) and 1 to 4096 prompts, e.g. "
              "65536x1), nor 'none'");
    runs.emplace_back(len, count);
  }
  return runs;
}

}  // namespace

// Sequence lengths and token counts are 32-bit positions in the kernels; other counts (batches,
// steps, repetitions) at least 1 – checked before anything runs, naming the flag.
const CLI::Range kLengths(int64_t{1}, int64_t{2147483646});
const CLI::Range kCounts(int64_t{1}, int64_t{1000000});

void register_bench_command(CLI::App& app) {
  CLI::App* bench = app.add_subcommand("bench", "Benchmarks (tables and JSON lines)");
  bench->require_subcommand(1);
  auto args = std::make_shared<BenchArgs>();
  CLI::App* attn = bench->add_subcommand(
      "attention", "NSA attention forward + backward time and peak memory over sequence lengths");
  attn->add_option("--device", args->device, "where to run")->check(CLI::IsMember({"cpu", "cuda"}));
  attn->add_option("--config", args->preset, "attention shape")
      ->check(CLI::IsMember(attention_preset_names()));
  attn->add_option("--seq-lens", args->seq_lens, "sequence lengths")
      ->delimiter(',')
      ->check(kLengths);
  attn->add_option("--batch", args->batch, "batch size B")->check(kCounts);
  attn->add_flag("!--no-backward", args->backward, "time the forward only");
  attn->add_option("--json", args->json_path, "also write JSON lines to this file");
  attn->add_option("--reps", args->reps, "GPU: timed repetitions (median reported)")
      ->check(kCounts);
  attn->add_option("--max-seconds", args->max_seconds,
                   "stop the sweep after a length whose forward + backward took longer (0: never)");
  add_config_flags(attn, args->flags, config_field_names());
  attn->callback([args] { bench_attention(*args); });

  auto dec = std::make_shared<DecodeArgs>();
  CLI::App* decode = bench->add_subcommand(
      "decode", "One attention layer's decode step: NSA caches vs dense, latency and K/V bytes");
  decode
      ->add_option("--device", dec->device,
                   "cpu: one attention layer (fp32); cuda: the whole model's step on one GPU")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  decode->add_option("--config", dec->preset, "attention shape")
      ->check(CLI::IsMember(attention_preset_names()));
  decode->add_option("--contexts", dec->contexts, "context lengths")
      ->delimiter(',')
      ->check(kLengths);
  decode->add_option("--steps", dec->steps, "timed decode steps per context (median)")
      ->check(kCounts);
  decode->add_option("--json", dec->json_path, "also write JSON lines to this file");
  auto gpu_dec = std::make_shared<DecodeBenchArgs>();
  decode->add_option("--model", gpu_dec->model, "cuda: model config (YAML; default m7c_125m)");
  decode->add_option("--batches", gpu_dec->batches, "cuda: batch sizes (sequences per step)")
      ->delimiter(',')
      ->check(kCounts);
  decode->add_option("--sdpa-script", gpu_dec->sdpa_script,
                     "cuda: the PyTorch SDPA baseline run in the same call (auto: "
                     "bench/dense_decode.py; off: none)");
  decode->add_option("--python", gpu_dec->python, "cuda: the interpreter of --sdpa-script");
  auto prefill = std::make_shared<std::vector<std::string>>();
  decode
      ->add_option("--prefill", *prefill,
                   "cuda: batched prefill runs LENxCOUNT (COUNT prompts of LEN tokens; default "
                   "65536x1,4096x16; none: skip)")
      ->delimiter(',');
  decode->add_option("--prefill-reps", gpu_dec->prefill_reps, "cuda: timed prefills per run")
      ->check(CLI::Range(int64_t{1}, int64_t{1000}));
  decode->add_flag("--trace", gpu_dec->trace,
                   "cuda: also print the attention kernels' phase timestamps (µs per phase)");
  decode->add_flag("--distinct-layers", gpu_dec->distinct_layers,
                   "cuda: time the attention alone with caches of its own per layer (SDPA's "
                   "baseline likewise), not one layer's caches called n_layers times");
  decode->callback([dec, gpu_dec, decode, prefill] {
    if (!prefill->empty()) gpu_dec->prefill = parse_prefill_runs(*prefill);
    if (dec->device == "cpu") {
      for (const char* o : {"--model", "--batches", "--sdpa-script", "--python", "--prefill",
                            "--prefill-reps", "--trace", "--distinct-layers"}) {
        NSA_CHECK(decode->count(o) == 0, "nsa bench decode --device cpu: ", o,
                  " belongs to --device cuda (the whole model's step on one GPU); the CPU "
                  "benchmark times one attention layer of --config");
      }
      bench_decode(*dec);
      return;
    }
    NSA_CHECK(!(gpu_dec->trace && gpu_dec->distinct_layers),
              "nsa bench decode: --trace times one layer's caches called n_layers times; drop "
              "--distinct-layers to trace");
    NSA_CHECK(decode->count("--config") == 0,
              "nsa bench decode --device cuda: --config belongs to --device cpu (one attention "
              "layer); the GPU benchmark takes the model's config with --model");
    const Backend gpu = backend(dec->device, "nsa bench decode");
    if (decode->count("--contexts") > 0) gpu_dec->contexts = dec->contexts;
    if (decode->count("--steps") > 0) gpu_dec->steps = dec->steps;
    gpu_dec->json_path = dec->json_path;
    gpu.bench_decode(*gpu_dec);
  });

  CLI::App* tr = bench->add_subcommand(
      "train", "Whole-model training throughput on one GPU: tok/s, MFU and memory over lengths");
  auto ta = std::make_shared<TrainBenchArgs>();
  auto sets = std::make_shared<std::vector<std::string>>();
  tr->add_option("--config", ta->config, "model config (YAML; default m7c_125m, byte vocabulary)");
  tr->add_option("--set", *sets, "override a config field: --set vocab_size=8192 (repeatable)");
  tr->add_option("--seq-lens", ta->seq_lens, "sequence lengths")->delimiter(',')->check(kLengths);
  tr->add_option("--tokens-per-step", ta->tokens_per_step, "batch = tokens-per-step / S (min 1)")
      ->check(kLengths);
  tr->add_option("--steps", ta->steps, "timed optimizer steps (median reported)")
      ->check(CLI::Range(int64_t{1}, int64_t{100000}));
  tr->add_option("--warmup", ta->warmup, "untimed steps first")
      ->check(CLI::Range(int64_t{0}, int64_t{100000}));
  auto recompute = std::make_shared<std::string>("none");
  tr->add_option("--recompute", *recompute,
                 "what the backward recomputes: none, ops or layers (a bare --recompute)")
      ->expected(0, 1);
  tr->add_flag("!--no-breakdown", ta->breakdown,
               "skip the per-phase breakdown (steps with CUDA events after the timed ones)");
  auto tr_device = std::make_shared<std::string>("cuda");
  tr->add_option("--device", *tr_device, "cuda (the benchmark runs on one GPU only)")
      ->check(CLI::IsMember({"cuda"}));
  tr->add_option("--dense-script", ta->dense_script,
                 "the dense PyTorch model of the same shape, run first in the same call (auto: "
                 "bench/dense_model_train.py; off: none)");
  tr->add_option("--python", ta->python, "the interpreter of --dense-script");
  tr->add_option("--json", ta->json_path, "also write JSON lines to this file");
  tr->callback([ta, sets, tr_device, recompute] {
    ta->recompute = parse_recompute(*recompute);
    for (const std::string& s : *sets) {
      const size_t eq = s.find('=');
      NSA_CHECK(eq != std::string::npos && eq > 0, "--set '", s, "' must look like field=value");
      ta->overrides[s.substr(0, eq)] = s.substr(eq + 1);
    }
    backend("cuda", "nsa bench train").bench_train(*ta);
  });
}

}  // namespace nsa::app
