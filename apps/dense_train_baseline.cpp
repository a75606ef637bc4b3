// The dense PyTorch baseline of the training benchmark: which models the script can build, its
// command line, and its JSON lines (see dense_train_baseline.h).
#include "dense_train_baseline.h"

#include <charconv>
#include <sstream>

#include "dense_baseline.h"

namespace nsa::app {
namespace {

// The shortest text that reads back as x (1e-05, not 1.0000000000000001e-05).
std::string shortest(double x) {
  char buf[32];
  const auto r = std::to_chars(buf, buf + sizeof(buf), x);
  return std::string(buf, r.ptr);
}

}  // namespace

DenseTrainBaseline parse_dense_train(const std::string& output) {
  DenseTrainBaseline out;
  for (const auto& [line, j] : json_lines(output)) {
    out.records.push_back(line);
    if (j.value("bench", "") != "dense_train") continue;
    const auto number = [&j](const char* key) {
      return j.contains(key) && j[key].is_number() ? j[key].get<double>() : 0.0;
    };
    DenseTrainResult r;
    r.batch = static_cast<int64_t>(number("batch"));
    r.step_ms = number("step_ms");
    r.tokens_per_s = number("tokens_per_s");
    r.peak_bytes = number("peak_bytes");
    const int64_t S = static_cast<int64_t>(number("S"));
    if (S > 0 && r.tokens_per_s > 0) out.by_len[S] = r;
  }
  return out;
}

std::string dense_train_mismatch(const ModelConfig& cfg) {
  const NsaConfig& a = cfg.attn;
  if (!cfg.tie_embeddings) return "the model's LM head is not tied to the embedding";
  if (cfg.mlp != "swiglu") return "the model's MLP is '" + cfg.mlp + "', the script's SwiGLU";
  if (a.dk != a.dv) {
    return "the script takes one head dim, the model has dk " + std::to_string(a.dk) + " and dv " +
           std::to_string(a.dv);
  }
  return "";
}

std::string dense_train_command(const std::string& interpreter, const std::string& script,
                                const ModelConfig& cfg, const std::vector<int64_t>& seq_lens,
                                int64_t tokens_per_step, int64_t steps, int64_t warmup) {
  std::ostringstream cmd;
  cmd << interpreter << " " << shell_quote(script) << " --seq-lens " << comma_list(seq_lens)
      << " --tokens-per-step " << tokens_per_step << " --steps " << steps << " --warmup " << warmup
      << " --dim " << cfg.dim << " --layers " << cfg.n_layers << " --heads " << cfg.attn.heads
      << " --groups " << cfg.attn.groups << " --head-dim " << cfg.attn.dk << " --vocab "
      << cfg.vocab_size << " --hidden " << cfg.ffn_hidden() << " --rope-base "
      << shortest(cfg.rope_base) << " --norm-eps " << shortest(cfg.norm_eps);
  return cmd.str();
}

DenseTrainBaseline run_dense_train(const std::string& command,
                                   const std::vector<int64_t>& seq_lens) {
  const ScriptRun run = run_script(command);
  DenseTrainBaseline out = parse_dense_train(run.output);
  std::vector<int64_t> missing;
  for (int64_t S : seq_lens) {
    if (out.by_len.count(S) == 0) missing.push_back(S);
  }
  if (run.status != 0 || !missing.empty()) {
    out.note =
        run.summary() + (missing.empty() ? "" : " (no result for S = " + comma_list(missing) + ")");
  }
  return out;
}

}  // namespace nsa::app
