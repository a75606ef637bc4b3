// `nsa diagnose`: the repro matrix the prototype's team needed – NSA attention forward + backward
// over attention shapes × sequence lengths × branch subsets × backends, one row each with
// pass/FAIL (non-finite values anywhere, or CUDA disagreeing with the CPU reference), time and
// peak memory. A failing row names its cause; the exit status is non-zero if any row failed.
// With --model: the same matrix for the whole model over layer counts (run_diagnose_model).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <sstream>

#include "backends.h"
#include "commands.h"
#include "nsa/attention.h"
#include "nsa/memory_stats.h"
#include "nsa/model_config.h"
#include "nsa/presets.h"
#include "train/train_model.h"

namespace nsa::app {
namespace {

struct DiagnoseArgs {
  std::vector<std::string> configs = {"tiny", "small"};
  std::vector<int64_t> seq_lens = {257, 1024, 4099};
  std::vector<std::string> branches = {"cmp,sel,win", "cmp", "sel", "win"};
  std::vector<std::string> backends = {"cpu", "cuda"};
  std::string model;                     // a model config: the model matrix instead
  std::vector<int64_t> layers = {1, 2};  // model matrix: layer counts
};

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, sep);) out.push_back(item);
  return out;
}

// The matrix's lists checked before any run, so that a typo is an error naming the flag, not a
// row of "pass" or "skip": backends cpu / cuda, branch subsets of cmp, sel, win (each once).
void check_matrix_flags(const DiagnoseArgs& a) {
  NSA_CHECK(!a.configs.empty(), "--configs names no attention config");
  NSA_CHECK(!a.backends.empty(), "--backends names no backend (cpu and/or cuda)");
  for (const std::string& b : a.backends) {
    NSA_CHECK(b == "cpu" || b == "cuda", "--backends: '", b, "' is not one of: cpu, cuda");
  }
  NSA_CHECK(!a.branches.empty(), "--branches names no branch subset (e.g. 'cmp,sel,win;win')");
  for (const std::string& subset : a.branches) {
    const std::vector<std::string> names = split(subset, ',');
    NSA_CHECK(!names.empty(), "--branches: an empty subset (subsets are ';'-separated)");
    for (const std::string& n : names) {
      NSA_CHECK(
          std::find(std::begin(kBranchNames), std::end(kBranchNames), n) != std::end(kBranchNames),
          "--branches: '", n, "' in '", subset, "' is not one of: cmp, sel, win");
      NSA_CHECK(std::count(names.begin(), names.end(), n) == 1, "--branches: '", n,
                "' appears twice in '", subset, "'");
    }
  }
}

// Round to bf16 (nearest even), what the CUDA backend does on upload: the CPU reference then
// sees the same inputs, and the comparison measures the kernels, not the input rounding (which
// alone flips near-tied block choices).
void round_to_bf16(Tensor<float>& t) {
  for (float& x : t.data) {
    uint32_t u;
    std::memcpy(&u, &x, 4);
    u += 0x7fffu + ((u >> 16) & 1u);
    u &= 0xffff0000u;
    std::memcpy(&x, &u, 4);
  }
}

bool all_finite(const Tensor<float>& t) {
  for (float x : t.data) {
    if (!std::isfinite(x)) return false;
  }
  return true;
}

// Names the first non-finite tensor of a forward/backward, or "".
std::string first_non_finite(const NsaForward<float>& f, const NsaTensors<float>& g) {
  if (!all_finite(f.o)) return "o";
  for (int c = 0; c < kNumBranches; ++c) {
    if (!all_finite(f.o_branch[c])) return std::string("o_") + kBranchNames[c];
  }
  if (!all_finite(g.q)) return "dq";
  for (int c = 0; c < kNumBranches; ++c) {
    if (!g.k[c].data.empty() && !all_finite(g.k[c])) return std::string("dk_") + kBranchNames[c];
    if (!g.v[c].data.empty() && !all_finite(g.v[c])) return std::string("dv_") + kBranchNames[c];
    if (!all_finite(g.gate[c])) return std::string("dg_") + kBranchNames[c];
  }
  return "";
}

[[maybe_unused]] double rel_err(const Tensor<float>& a, const Tensor<float>& b) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    num += (a[i] - b[i]) * static_cast<double>(a[i] - b[i]);
    den += static_cast<double>(b[i]) * b[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

int run_diagnose(const DiagnoseArgs& a) {
  std::printf("%-10s %7s %-12s %-7s %-6s %10s %10s %9s  %s\n", "config", "S", "branches", "backend",
              "result", "fwd+bwd ms", "peak MiB", "rel err", "note");
  int failures = 0;
  for (const std::string& name : a.configs) {
    const NsaConfig cfg = attention_preset(name);
    for (int64_t S : a.seq_lens) {
      const SeqLayout layout = SeqLayout::batch(1, S);
      for (const std::string& br : a.branches) {
        NsaTensors<float> in = random_nsa_inputs<float>(cfg, S, 7);
        round_to_bf16(in.q);
        for (int c = 0; c < kNumBranches; ++c) {
          round_to_bf16(in.k[c]), round_to_bf16(in.v[c]), round_to_bf16(in.gate[c]);
          if (("," + br + ",").find(std::string(",") + kBranchNames[c] + ",") ==
              std::string::npos) {
            in.gate[c].fill(0.0f);
          }
        }
        NsaConfig do_cfg = cfg;
        do_cfg.dk = cfg.dv;
        Tensor<float> d_o = random_nsa_inputs<float>(do_cfg, S, 8).q;
        round_to_bf16(d_o);
        NsaForward<float> ref;
        for (const std::string& backend : a.backends) {
          std::string result = "pass", note;
          double ms = 0, peak = 0, err = 0;
          try {
            const auto t0 = std::chrono::steady_clock::now();
            if (backend == "cpu") {
              const int64_t base = host_memory_stats().current_bytes;
              reset_host_peak();
              ref = nsa_forward_cpu(cfg, layout, in);
              const NsaTensors<float> g = nsa_backward_cpu(cfg, layout, in, ref, d_o);
              peak = static_cast<double>(host_memory_stats().peak_bytes - base);
              note = first_non_finite(ref, g);
            } else if (const Backend* b = find_backend(backend); !b) {
              result = "skip", note = "built without CUDA";
            } else if (b->device_count() == 0) {
              result = "skip", note = "no CUDA device";
            } else {
              const AttentionRun r = b->attention(cfg, layout, in, &d_o);
              peak = static_cast<double>(r.device_bytes);
              note = first_non_finite(r.fwd, *r.grads);
              if (note.empty() && !ref.o.data.empty()) {
                err = rel_err(r.fwd.o, ref.o);
                if (err > 2e-2) note = "o differs from the CPU reference";
              }
            }
            ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                     .count();
            if (!note.empty() && result == "pass") {
              result = "FAIL";
              if (note.find(' ') == std::string::npos) note = "non-finite " + note;
            }
          } catch (const std::exception& e) {
            result = "FAIL", note = e.what();
          }
          failures += result == "FAIL";
          std::printf("%-10s %7lld %-12s %-7s %-6s %10.1f %10.2f %9.1e  %s\n", name.c_str(),
                      static_cast<long long>(S), br.c_str(), backend.c_str(), result.c_str(), ms,
                      peak / (1 << 20), err, note.c_str());
          std::fflush(stdout);
        }
      }
    }
  }
  std::printf("%d failure(s)\n", failures);
  return failures;
}

// The model matrix: layers × lengths × branch subsets × backends, one forward + backward of the
// whole model each (random tokens, the config's seeded initial weights). A row fails on a
// non-finite loss or gradient norm, or when CUDA's loss / gradient norm differ from the CPU
// row's by more than 5e-3 / 5e-2 relative (the bf16 GEMM operands; tests/cuda/test_model_cuda.cpp).
int run_diagnose_model(const DiagnoseArgs& a) {
  std::printf("%-6s %7s %-12s %-7s %-6s %10s %10s %10s %9s  %s\n", "layers", "S", "branches",
              "backend", "result", "loss", "fwd+bwd ms", "peak MiB", "rel err", "note");
  int failures = 0;
  for (int64_t layers : a.layers) {
    for (int64_t S : a.seq_lens) {
      for (const std::string& br : a.branches) {
        ModelConfig cfg = load_model_config(a.model);
        set_model_field(cfg, "n_layers", std::to_string(layers));
        set_model_field(cfg, "branches", br);
        const SeqLayout layout = SeqLayout::batch(1, S);
        Batch batch;
        for (int64_t t = 0; t < S; ++t) {
          batch.inputs.push_back(static_cast<int32_t>((t * 2654435761u) % cfg.vocab_size));
          batch.targets.push_back(static_cast<int32_t>((t * 40503u + 7) % cfg.vocab_size));
        }
        double ref_loss = 0, ref_norm = 0;
        for (const std::string& backend : a.backends) {
          std::string result = "pass", note;
          double ms = 0, peak = 0, err = 0, loss = 0;
          try {
            TrainModelFactory make = make_train_model_cpu;
            if (backend != "cpu") {
              const Backend* b = find_backend(backend);
              make = b && b->device_count() > 0 ? b->train_model : TrainModelFactory();
              if (!make) result = "skip", note = b ? "no CUDA device" : "built without CUDA";
            }
            if (make) {
              const int64_t base = host_memory_stats().current_bytes;
              reset_host_peak();
              const auto t0 = std::chrono::steady_clock::now();
              std::unique_ptr<TrainModel> m = make(cfg, layout, AdamWConfig{}, Recompute::kNone);
              m->zero_grads();
              loss = m->forward_backward(batch, true, nullptr);
              const double norm = m->optimizer_step(0, 1.0);
              ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                       .count();
              peak = backend == "cpu" ? static_cast<double>(host_memory_stats().peak_bytes - base)
                                      : static_cast<double>(m->device_bytes());
              if (!std::isfinite(loss)) note = "non-finite loss";
              if (note.empty() && !std::isfinite(norm)) note = "non-finite gradient";
              if (backend == "cpu") {
                ref_loss = loss, ref_norm = norm;
              } else if (note.empty() && ref_norm > 0) {
                err = std::abs(loss - ref_loss) / std::abs(ref_loss);
                const double norm_err = std::abs(norm - ref_norm) / ref_norm;
                if (err > 5e-3) note = "loss differs from the CPU model";
                if (note.empty() && norm_err > 5e-2)
                  note = "gradient norm differs from the CPU model";
              }
              if (!note.empty()) result = "FAIL";
            }
          } catch (const std::exception& e) {
            result = "FAIL", note = e.what();
          }
          failures += result == "FAIL";
          std::printf("%-6lld %7lld %-12s %-7s %-6s %10.5f %10.1f %10.2f %9.1e  %s\n",
                      static_cast<long long>(layers), static_cast<long long>(S), br.c_str(),
                      backend.c_str(), result.c_str(), loss, ms, peak / (1 << 20), err,
                      note.c_str());
          std::fflush(stdout);
        }
      }
    }
  }
  std::printf("%d failure(s)\n", failures);
  return failures;
}

}  // namespace

void register_diagnose_command(CLI::App& app) {
  auto a = std::make_shared<DiagnoseArgs>();
  auto configs = std::make_shared<std::string>("tiny,small");
  auto branches = std::make_shared<std::string>("cmp,sel,win;cmp;sel;win");
  auto backends = std::make_shared<std::string>("cpu,cuda");
  CLI::App* cmd = app.add_subcommand(
      "diagnose", "Matrix of NSA attention runs: shapes × lengths × branches × backends");
  cmd->add_option("--configs", *configs, "attention shapes, comma-separated");
  cmd->add_option("--seq-lens", a->seq_lens, "sequence lengths")->delimiter(',');
  cmd->add_option("--branches", *branches, "branch subsets, ';'-separated (e.g. 'cmp,sel;win')");
  cmd->add_option("--backends", *backends, "cpu and/or cuda");
  CLI::Option* model = cmd->add_option(
      "--model", a->model,
      "a model config (YAML): run the whole model over --layers instead of attention");
  cmd->add_option("--layers", a->layers, "with --model: layer counts")
      ->delimiter(',')
      ->check(CLI::Range(int64_t{1}, int64_t{1024}))
      ->needs(model);
  cmd->callback([a, configs, branches, backends] {
    a->configs = split(*configs, ',');
    a->branches = split(*branches, ';');
    a->backends = split(*backends, ',');
    check_matrix_flags(*a);
    const int failures = a->model.empty() ? run_diagnose(*a) : run_diagnose_model(*a);
    if (failures != 0) throw Error("nsa diagnose: some runs failed (rows marked FAIL)");
  });
}

}  // namespace nsa::app
