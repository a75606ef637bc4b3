// `nsa attention`: NSA forward (and backward) on tensors from a safetensors file – the interop
// contract of docs/interop.md – and `--write-example` to produce a valid random input file.
#include <cstdio>
#include <filesystem>
#include <memory>

#include "backends.h"
#include "commands.h"
#include "config_flags.h"
#include "io/attention_file.h"
#include "nsa/attention.h"
#include "nsa/presets.h"
#include "nsa/size_limits.h"

namespace nsa::app {
namespace {

struct AttentionArgs {
  std::string in, out, example;
  std::string device = "cpu";
  std::string preset = "tiny";
  int64_t batch = 1;
  int64_t seq_len = 300;
  uint64_t seed = 0;
  ConfigFlags flags;
};

void write_example(const AttentionArgs& a) {
  NSA_CHECK(a.in.empty() && a.out.empty(), "--write-example FILE only writes an input file: ",
            "drop --in/--out, or drop --write-example to run on --in");
  const NsaConfig cfg = apply_config_flags(attention_preset(a.preset), a.flags);
  io::make_example_problem(cfg, a.batch, a.seq_len, a.seed).write(a.example);
  std::printf("wrote %s: B=%lld S=%lld %s (inputs, gates and do)\n", a.example.c_str(),
              static_cast<long long>(a.batch), static_cast<long long>(a.seq_len),
              cfg.summary().c_str());
}

void run_attention(const AttentionArgs& a) {
  NSA_CHECK(!a.in.empty() && !a.out.empty(),
            "nsa attention needs --in FILE and --out FILE (or --write-example FILE)");
  std::error_code ec;
  NSA_CHECK(!std::filesystem::equivalent(a.in, a.out, ec), "--out '", a.out,
            "' is the --in file: the results would replace the inputs; pass another --out");
  for (const char* f : {"heads", "groups", "dk", "dv", "phi_hidden", "gate"}) {
    NSA_CHECK(!a.flags.values.count(f), "--", f,
              " is read from the tensor shapes of --in; drop it");
  }
  const io::AttentionProblem p =
      io::load_attention_problem(io::SafetensorsFile::read(a.in), a.flags.values);
  const std::string sel = str("sel_idx [T, G, n_sel] (n_sel = ", p.cfg.n_sel, ")");
  check_memory(
      checked_product({p.layout.total_tokens(), p.cfg.groups, p.cfg.n_sel, int64_t{4}}, sel), sel);
  const AttentionRun r = backend(a.device, "nsa attention")
                             .attention(p.cfg, p.layout, p.in, p.has_do ? &p.d_o : nullptr);
  const NsaForward<float>& fwd = r.fwd;
  const NsaTensors<float>* grads = r.grads.get();
  const double fwd_ms = r.fwd_ms, bwd_ms = r.bwd_ms;
  io::save_attention_result(a.out, p, fwd, grads);
  std::printf("nsa attention (%s): %lld sequence(s), %lld tokens, %s\n", a.device.c_str(),
              static_cast<long long>(p.layout.num_seqs()),
              static_cast<long long>(p.layout.total_tokens()), p.cfg.summary().c_str());
  char backward[64] = " (no 'do' tensor: no backward)";
  if (p.has_do) std::snprintf(backward, sizeof backward, ", backward %.2f ms", bwd_ms);
  std::printf("  forward %.2f ms%s -> %s\n", fwd_ms, backward, a.out.c_str());
}

}  // namespace

void register_attention_command(CLI::App& app) {
  auto args = std::make_shared<AttentionArgs>();
  CLI::App* cmd = app.add_subcommand(
      "attention", "NSA attention on tensors from a safetensors file (see docs/interop.md)");
  cmd->add_option("--in", args->in, "input safetensors file (q, k_*/v_*, g_*, optional do)");
  cmd->add_option("--out", args->out, "output safetensors file (o, o_*, lse_*, sel_idx, d*)");
  cmd->add_option("--device", args->device, "where to run")->check(CLI::IsMember({"cpu", "cuda"}));
  cmd->add_option("--write-example", args->example,
                  "write a random valid input file of the --config shape to FILE and exit");
  cmd->add_option("--config", args->preset, "attention shape for --write-example")
      ->check(CLI::IsMember(attention_preset_names()));
  cmd->add_option("--batch", args->batch, "batch size B for --write-example");
  cmd->add_option("--seq-len", args->seq_len, "sequence length S for --write-example");
  cmd->add_option("--seed", args->seed, "random seed for --write-example");
  add_config_flags(cmd, args->flags, config_field_names());
  cmd->callback([args] {
    if (!args->example.empty()) {
      write_example(*args);
    } else {
      run_attention(*args);
    }
  });
}

}  // namespace nsa::app
