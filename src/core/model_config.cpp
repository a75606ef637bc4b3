// Model configuration: fields, validation, YAML (see include/nsa/model_config.h).
#include "nsa/model_config.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <iomanip>
#include <set>

#include "nsa/error.h"
#include "nsa/size_limits.h"

namespace nsa {
void ModelConfig::validate() const {
  // Tokens and positions are 32-bit; widths and depths far beyond any model's are refused before
  // a product of them overflows (the weights' size is checked below). Depth: 4,096 layers, some
  // thirty times today's deepest models – a million small layers fit in memory, but a step would
  // take hours (4,096 layers of configs/tiny.yaml: 40 s for one step and its checkpoint on 2
  // cores).
  const struct {
    const char* name;
    int64_t value, max;
  } sizes[] = {{"vocab_size", vocab_size, 2147483647},
               {"dim", dim, 1 << 20},
               {"n_layers", n_layers, 4096},
               {"seq_len", seq_len, 2147483647}};
  for (const auto& f : sizes) {
    NSA_CHECK(f.value > 0, f.name, " = ", f.value, " must be positive");
    NSA_CHECK(f.value <= f.max, f.name, " = ", f.value, " must be at most ", f.max);
  }
  NSA_CHECK(mlp_hidden >= 0 && mlp_hidden <= (1 << 22), "mlp_hidden = ", mlp_hidden,
            " must be in [0, ", 1 << 22, "] (0 = default)");
  NSA_CHECK(mlp == "swiglu" || mlp == "silu", "mlp = '", mlp, "' is not one of: swiglu, silu");
  NSA_CHECK(std::isfinite(rope_base) && rope_base > 0, "rope_base = ", rope_base,
            " must be a positive number");
  NSA_CHECK(std::isfinite(norm_eps) && norm_eps > 0, "norm_eps = ", norm_eps,
            " must be a positive number");
  NSA_CHECK(std::isfinite(init_std) && init_std > 0, "init_std = ", init_std,
            " must be a positive number");
  std::string rest = branches;
  NSA_CHECK(!rest.empty(), "branches is empty; list some of: cmp, sel, win");
  while (!rest.empty()) {
    const std::string name = rest.substr(0, rest.find(','));
    rest = rest.size() > name.size() ? rest.substr(name.size() + 1) : "";
    NSA_CHECK(name == "cmp" || name == "sel" || name == "win", "branches: '", name,
              "' is not a branch; allowed: cmp, sel, win (comma-separated)");
  }
  NSA_CHECK(attention == "nsa" || attention == "full" || attention == "window", "attention = '",
            attention, "' is not one of: ", kAttentionModes);
  NSA_CHECK(attention == "nsa" || branches == "cmp,sel,win" || branches == "win",
            "attention = ", attention,
            " runs the window branch alone; it cannot be combined with branches = '", branches,
            "' (leave branches at cmp,sel,win)");
  attn.validate();
  NSA_CHECK(attn.dk % 2 == 0, "dk = ", attn.dk, " must be even (RoPE rotates pairs)");
  // The fp32 weights (a lower bound: embedding, the attention's Q and output projections, the
  // MLP) must fit in memory before any is allocated.
  const std::string what = "the model's fp32 weights";
  const int64_t per_layer = checked_product({dim, attn.heads, attn.dk + attn.dv}, what) +
                            checked_product({3, dim, ffn_hidden()}, what);
  const int64_t bytes = checked_product({vocab_size, dim, 4}, what) +  // at most 2^53
                        checked_product({n_layers, per_layer, 4}, what);
  check_memory(bytes, str(what, " (", bytes / 4, " parameters)"));
}

int64_t ModelConfig::ffn_hidden() const {
  if (mlp_hidden > 0) return mlp_hidden;
  if (mlp == "silu") return 4 * dim;
  const int64_t h = (8 * dim + 2) / 3;
  return (h + 63) / 64 * 64;
}

const char* const kAttentionModes = "nsa, full, window";

bool ModelConfig::branch_enabled(int branch) const {
  if (attention != "nsa") return branch == kWin;
  const std::string list = "," + branches + ",";
  return list.find(std::string(",") + kBranchNames[branch] + ",") != std::string::npos;
}

NsaConfig ModelConfig::layer_attention(int64_t max_len) const {
  NsaConfig a = attn;
  if (attention == "full") a.w = std::max(a.w, max_len);
  return a;
}

void set_model_field(ModelConfig& cfg, const std::string& field, const std::string& value) {
  if (field == "vocab_size") {
    cfg.vocab_size = parse_int_field(field, value);
  } else if (field == "dim") {
    cfg.dim = parse_int_field(field, value);
  } else if (field == "n_layers") {
    cfg.n_layers = parse_int_field(field, value);
  } else if (field == "seq_len") {
    cfg.seq_len = parse_int_field(field, value);
  } else if (field == "mlp") {
    cfg.mlp = value;
  } else if (field == "mlp_hidden") {
    cfg.mlp_hidden = parse_int_field(field, value);
  } else if (field == "tie_embeddings") {
    NSA_CHECK(value == "true" || value == "false", "tie_embeddings = '", value,
              "' must be true or false");
    cfg.tie_embeddings = value == "true";
  } else if (field == "branches") {
    cfg.branches = value;
  } else if (field == "attention") {
    cfg.attention = value;
  } else if (field == "rope_base") {
    cfg.rope_base = parse_double_field(field, value);
  } else if (field == "norm_eps") {
    cfg.norm_eps = parse_double_field(field, value);
  } else if (field == "init_std") {
    cfg.init_std = parse_double_field(field, value);
  } else if (field == "seed") {
    // Non-negative, so that the checkpoint's text of it reads back through this parser.
    const int64_t seed = parse_int_field(field, value);
    NSA_CHECK(seed >= 0, "seed = ", seed, " must be in [0, 2^63 - 1]");
    cfg.seed = static_cast<uint64_t>(seed);
  } else {
    // An unknown field lists every field a model config has (the model's and the attention's),
    // not the attention's alone as set_config_field would.
    const auto fields = model_config_fields(ModelConfig{});
    if (fields.count(field) == 0) {
      std::string known;
      for (const auto& f : fields) known += (known.empty() ? "" : ", ") + f.first;
      throw Error(str("unknown config field '", field, "'; known: ", known));
    }
    set_config_field(cfg.attn, field, value);
  }
}

std::map<std::string, std::string> model_config_fields(const ModelConfig& c) {
  auto num = [](double x) { return str(std::setprecision(17), x); };
  return {{"vocab_size", std::to_string(c.vocab_size)},
          {"dim", std::to_string(c.dim)},
          {"n_layers", std::to_string(c.n_layers)},
          {"seq_len", std::to_string(c.seq_len)},
          {"mlp", c.mlp},
          {"mlp_hidden", std::to_string(c.mlp_hidden)},
          {"tie_embeddings", c.tie_embeddings ? "true" : "false"},
          {"branches", c.branches},
          {"attention", c.attention},
          {"rope_base", num(c.rope_base)},
          {"norm_eps", num(c.norm_eps)},
          {"init_std", num(c.init_std)},
          {"seed", std::to_string(c.seed)},
          {"heads", std::to_string(c.attn.heads)},
          {"groups", std::to_string(c.attn.groups)},
          {"dk", std::to_string(c.attn.dk)},
          {"dv", std::to_string(c.attn.dv)},
          {"l", std::to_string(c.attn.l)},
          {"d", std::to_string(c.attn.d)},
          {"l_sel", std::to_string(c.attn.l_sel)},
          {"n_sel", std::to_string(c.attn.n_sel)},
          {"w", std::to_string(c.attn.w)},
          {"scale", num(c.attn.scale)},
          {"phi", to_string(c.attn.phi)},
          {"kv", to_string(c.attn.kv)},
          {"gate", to_string(c.attn.gate)},
          {"phi_hidden", std::to_string(c.attn.phi_hidden)}};
}

ModelConfig load_model_config(const std::string& path) {
  // A name instead of a path (`--config tiny`) is the likely slip: say what the flag takes.
  std::error_code ec;
  NSA_CHECK(std::filesystem::exists(path, ec), "config '", path,
            "' does not exist: a model config is a YAML file, e.g. configs/tiny.yaml");
  NSA_CHECK(!std::filesystem::is_directory(path, ec), "config '", path,
            "' is a directory, not a YAML file");
  YAML::Node root;
  try {
    root = YAML::LoadFile(path);
  } catch (const std::exception& e) {
    throw Error(str("cannot read config '", path, "': ", e.what()));
  }
  NSA_CHECK(root.IsMap(), "config '", path, "' must be a map of `field: value` lines");
  ModelConfig cfg;
  std::set<std::string> seen;
  for (const auto& kv : root) {
    const std::string key = kv.first.as<std::string>();
    NSA_CHECK(kv.second.IsScalar(), "config '", path, "': field '", key, "' must be a scalar");
    // YAML keeps the last of two equal keys without a word; a config that sets a field twice is
    // more likely an edit gone wrong.
    NSA_CHECK(seen.insert(key).second, "config '", path, "': field '", key, "' appears twice");
    try {
      set_model_field(cfg, key, kv.second.as<std::string>());
    } catch (const Error& e) {
      throw Error(str("config '", path, "': ", e.what()));
    }
  }
  // The fields without a default (their 0 would be refused by validate() as "must be positive",
  // which does not say the file lacks them).
  for (const char* field : {"vocab_size", "dim", "n_layers", "seq_len", "heads", "groups", "dk",
                            "dv", "l", "d", "l_sel", "n_sel", "w"}) {
    NSA_CHECK(seen.count(field) != 0, "config '", path, "' lacks the field '", field,
              "' (it has no default)");
  }
  return cfg;
}

}  // namespace nsa
