// The model configuration: a Llama-style decoder whose attention is NSA (docs/training.md,
// "Model").
//
// Configs are YAML files in configs/ (flat `key: value`); every field can be overridden from the
// command line with the same names. set_model_field is the one parser behind both, so errors are
// the same everywhere and name the field.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "nsa/config.h"

namespace nsa {

struct ModelConfig {
  int64_t vocab_size = 0;
  int64_t dim = 0;
  int64_t n_layers = 0;
  int64_t seq_len = 0;
  NsaConfig attn;              // heads, groups, dk, dv, l, d, l_sel, n_sel, w, phi, kv, gate
  std::string mlp = "swiglu";  // swiglu | silu (the prototype's, hidden 4·dim)
  int64_t mlp_hidden = 0;  // 0: swiglu → 8/3·dim rounded up to a multiple of 64; silu → 4·dim
  bool tie_embeddings = true;  // LM head shares the token embedding
  // Which NSA branches contribute (docs/training.md, "Diagnostics"): a listed subset of cmp, sel,
  // win; the gates of the others are forced to 0.
  std::string branches = "cmp,sel,win";
  // The attention of every layer (docs/quality.md): nsa (all three branches); full (causal dense
  // attention: the window branch alone, its window widened to cover every sequence); window (the
  // window branch alone at w). The single-branch modes keep every parameter and the window
  // branch's own gate; the other gates are forced to 0, as with branches = win.
  std::string attention = "nsa";
  double rope_base = 10000.0;
  double norm_eps = 1e-5;
  double init_std = 0.02;
  uint64_t seed = 1337;

  void validate() const;  // throws nsa::Error naming the field
  int64_t ffn_hidden() const;
  // Whether a branch contributes: listed in `branches`, and the window alone unless attention is
  // nsa.
  bool branch_enabled(int branch) const;
  // The attention each layer runs over sequences of at most max_len tokens: attn, except that
  // attention = full widens the window to w = max(w, max_len), so that it covers every position.
  NsaConfig layer_attention(int64_t max_len) const;
};

// The values of ModelConfig::attention, for messages: "nsa, full, window".
extern const char* const kAttentionModes;

// Sets one field by name from text; attention fields (heads, l, n_sel, ...) are accepted too.
void set_model_field(ModelConfig& cfg, const std::string& field, const std::string& value);
// Reads a YAML config; unknown keys are errors naming the key and the file.
ModelConfig load_model_config(const std::string& path);
// Every field as text, in the form set_model_field reads back (checkpoints store it).
std::map<std::string, std::string> model_config_fields(const ModelConfig& cfg);

}  // namespace nsa
