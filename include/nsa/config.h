// NSA attention hyper-parameters and the sequence layout of a batch.
//
// NsaConfig holds the shape (H, G, dk, dv) and the NSA hyper-parameters of docs/nsa.md; validate()
// enforces the rules (d | l, d | l_sel, G | H, ...) with messages that name the field. SeqLayout
// describes how the token dimension T is cut into independent sequences: a padded batch B × S is
// simply cu_seqlens = {0, S, 2S, ..., B·S}, packed documents bring their own cu_seqlens.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace nsa {

// The three NSA branches, in the order used by every per-branch array.
enum Branch : int { kCmp = 0, kSel = 1, kWin = 2 };
constexpr int kNumBranches = 3;
constexpr const char* kBranchNames[kNumBranches] = {"cmp", "sel", "win"};

enum class Phi { kAvg, kMlp };                     // compression function φ
enum class KvMode { kSeparate, kShared };          // K/V per branch, or one K/V for all three
enum class GateActivation { kSigmoid, kSoftmax };  // how gate logits become gate values

Phi parse_phi(const std::string& s);                         // "avg" | "mlp"
KvMode parse_kv_mode(const std::string& s);                  // "separate" | "shared"
GateActivation parse_gate_activation(const std::string& s);  // "sigmoid" | "softmax"
const char* to_string(Phi phi);
const char* to_string(KvMode kv);
const char* to_string(GateActivation gate);

struct NsaConfig {
  // Shape.
  int64_t heads = 0;   // H query heads
  int64_t groups = 0;  // G key/value groups; H / G query heads share one group
  int64_t dk = 0;      // query/key head dim
  int64_t dv = 0;      // value head dim
  // Hyper-parameters (docs/nsa.md, first section).
  int64_t l = 0;       // compression block length
  int64_t d = 0;       // compression stride, divides l and l_sel
  int64_t l_sel = 0;   // selection block length
  int64_t n_sel = 0;   // selected blocks per query, forced ones included (>= 3)
  int64_t w = 0;       // sliding window
  double scale = 0.0;  // softmax scale; 0 means 1/sqrt(dk)
  Phi phi = Phi::kAvg;
  KvMode kv = KvMode::kSeparate;
  GateActivation gate = GateActivation::kSigmoid;
  int64_t phi_hidden = 0;  // hidden width of the φ = mlp compressor; 0 means dk

  // Throws nsa::Error naming the first field that breaks a rule.
  void validate() const;

  int64_t heads_per_group() const { return heads / groups; }
  double softmax_scale() const;
  int64_t mlp_hidden() const { return phi_hidden > 0 ? phi_hidden : dk; }
  // Compressed tokens of a sequence of length S: 0 if S < l, else (S - l) / d + 1.
  int64_t num_compressed(int64_t S) const { return S < l ? 0 : (S - l) / d + 1; }
  // Compressed tokens visible to query t: those with i·d + l <= t + 1.
  int64_t num_visible_compressed(int64_t t) const { return num_compressed(t + 1); }
  // Selection blocks touched by a sequence of length S (the last one may be partial).
  int64_t num_selection_blocks(int64_t S) const { return (S + l_sel - 1) / l_sel; }
  // Which K/V tensor a branch reads: its own, or the shared one (index 0).
  int kv_index(int branch) const { return kv == KvMode::kShared ? 0 : branch; }
  std::string summary() const;
};

// Whole-string numeric parsing for config fields; nsa::Error "<field> = '<value>' is not ...".
int64_t parse_int_field(const std::string& field, const std::string& value);
double parse_double_field(const std::string& field, const std::string& value);

// Sets one field by name from text ("l", "n_sel", "phi", "scale", ...): the one parser behind
// config files, file metadata and command-line overrides. Throws nsa::Error naming the field.
void set_config_field(NsaConfig& cfg, const std::string& field, const std::string& value);
// The fields set_config_field knows, in documentation order.
const std::vector<std::string>& config_field_names();

struct SeqLayout {
  std::vector<int64_t> cu_seqlens;  // [N + 1]: 0 = cu[0] <= cu[1] <= ... <= cu[N] = T

  static SeqLayout batch(int64_t B, int64_t S);
  // Validates a user-provided cu_seqlens against the token count T; names the tensor on error.
  static SeqLayout packed(const std::vector<int64_t>& cu_seqlens, int64_t total_tokens);

  int64_t num_seqs() const { return static_cast<int64_t>(cu_seqlens.size()) - 1; }
  int64_t total_tokens() const { return cu_seqlens.back(); }
  int64_t start(int64_t n) const { return cu_seqlens[n]; }
  int64_t length(int64_t n) const { return cu_seqlens[n + 1] - cu_seqlens[n]; }
  int64_t max_length() const;  // of the longest sequence (0 when there is none)
  // Prefix sums of compressed-token counts, [N + 1], for indexing packed compressed K/V.
  std::vector<int64_t> compressed_offsets(const NsaConfig& cfg) const;
};

}  // namespace nsa
