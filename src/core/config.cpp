// Validation and parsing of NSA hyper-parameters (see include/nsa/config.h).
#include "nsa/config.h"

#include <algorithm>
#include <cmath>

#include "nsa/error.h"

namespace nsa {

Phi parse_phi(const std::string& s) {
  if (s == "avg") return Phi::kAvg;
  if (s == "mlp") return Phi::kMlp;
  throw Error(str("phi = '", s, "' is not a compression function; allowed: avg, mlp"));
}

KvMode parse_kv_mode(const std::string& s) {
  if (s == "separate") return KvMode::kSeparate;
  if (s == "shared") return KvMode::kShared;
  throw Error(str("kv = '", s, "' is not a K/V mode; allowed: separate, shared"));
}

GateActivation parse_gate_activation(const std::string& s) {
  if (s == "sigmoid") return GateActivation::kSigmoid;
  if (s == "softmax") return GateActivation::kSoftmax;
  throw Error(str("gate = '", s, "' is not a gate activation; allowed: sigmoid, softmax"));
}

const char* to_string(Phi phi) {
  return phi == Phi::kAvg ? "avg" : "mlp";
}
const char* to_string(KvMode kv) {
  return kv == KvMode::kSeparate ? "separate" : "shared";
}
const char* to_string(GateActivation g) {
  return g == GateActivation::kSigmoid ? "sigmoid" : "softmax";
}

void NsaConfig::validate() const {
  // Token positions and block indices are 32-bit in the kernels; head counts and head dims beyond
  // 2^16 are no attention anyone runs, and would overflow the products of buffer sizes.
  constexpr int64_t kPos = 2147483647, kHead = 65536;
  const struct {
    const char* name;
    int64_t value, max;
  } positive[] = {{"heads", heads, kHead}, {"groups", groups, kHead},
                  {"dk", dk, kHead},       {"dv", dv, kHead},
                  {"l", l, kPos},          {"d", d, kPos},
                  {"l_sel", l_sel, kPos},  {"n_sel", n_sel, kPos},
                  {"w", w, kPos}};
  for (const auto& f : positive) {
    NSA_CHECK(f.value > 0, f.name, " = ", f.value, " must be a positive integer");
    NSA_CHECK(f.value <= f.max, f.name, " = ", f.value, " must be at most ", f.max);
  }
  NSA_CHECK(heads % groups == 0, "heads = ", heads, " must be a multiple of groups = ", groups,
            " (each K/V group serves heads/groups query heads)");
  NSA_CHECK(l % d == 0, "l = ", l, " must be a multiple of d = ", d,
            " (compression stride d divides block length l)");
  NSA_CHECK(l_sel % d == 0, "l_sel = ", l_sel, " must be a multiple of d = ", d,
            " (compression stride d divides selection block length l_sel)");
  NSA_CHECK(n_sel >= 3, "n_sel = ", n_sel,
            " must be at least 3 (blocks 0, c-1 and c are always selected)");
  check_finite_non_negative("scale", scale, " (0: 1/sqrt(dk))");
  NSA_CHECK(phi_hidden >= 0 && phi_hidden <= kHead, "phi_hidden = ", phi_hidden, " must be in [0, ",
            kHead, "] (0 means dk)");
}

double NsaConfig::softmax_scale() const {
  return scale > 0.0 ? scale : 1.0 / std::sqrt(static_cast<double>(dk));
}

std::string NsaConfig::summary() const {
  return str("H=", heads, " G=", groups, " dk=", dk, " dv=", dv, " l=", l, " d=", d,
             " l_sel=", l_sel, " n_sel=", n_sel, " w=", w, " phi=", to_string(phi),
             " kv=", to_string(kv));
}

int64_t parse_int_field(const std::string& field, const std::string& value) {
  size_t used = 0;
  int64_t v = 0;
  try {
    v = std::stoll(value, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  NSA_CHECK(!value.empty() && used == value.size(), field, " = '", value, "' is not an integer");
  return v;
}

double parse_double_field(const std::string& field, const std::string& value) {
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(value, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  NSA_CHECK(!value.empty() && used == value.size(), field, " = '", value, "' is not a number");
  return v;
}

const std::vector<std::string>& config_field_names() {
  static const std::vector<std::string> names = {"heads", "groups", "dk",    "dv",        "l",
                                                 "d",     "l_sel",  "n_sel", "w",         "scale",
                                                 "phi",   "kv",     "gate",  "phi_hidden"};
  return names;
}

void set_config_field(NsaConfig& cfg, const std::string& field, const std::string& value) {
  int64_t* ints[] = {&cfg.heads, &cfg.groups, &cfg.dk,    &cfg.dv, &cfg.l,
                     &cfg.d,     &cfg.l_sel,  &cfg.n_sel, &cfg.w};
  const auto& names = config_field_names();
  for (size_t i = 0; i < sizeof(ints) / sizeof(ints[0]); ++i) {
    if (field == names[i]) {
      *ints[i] = parse_int_field(field, value);
      return;
    }
  }
  if (field == "scale") {
    cfg.scale = parse_double_field(field, value);
  } else if (field == "phi") {
    cfg.phi = parse_phi(value);
  } else if (field == "kv") {
    cfg.kv = parse_kv_mode(value);
  } else if (field == "gate") {
    cfg.gate = parse_gate_activation(value);
  } else if (field == "phi_hidden") {
    cfg.phi_hidden = parse_int_field(field, value);
  } else {
    std::string known;
    for (const auto& n : names) known += (known.empty() ? "" : ", ") + n;
    throw Error(str("unknown attention config field '", field, "'; known: ", known));
  }
}

SeqLayout SeqLayout::batch(int64_t B, int64_t S) {
  NSA_CHECK(B > 0 && S > 0, "batch B = ", B, " and sequence length S = ", S, " must be positive");
  SeqLayout layout;
  for (int64_t b = 0; b <= B; ++b) layout.cu_seqlens.push_back(b * S);
  return layout;
}

int64_t SeqLayout::max_length() const {
  int64_t m = 0;
  for (int64_t n = 0; n < num_seqs(); ++n) m = std::max(m, length(n));
  return m;
}

SeqLayout SeqLayout::packed(const std::vector<int64_t>& cu, int64_t total_tokens) {
  NSA_CHECK(cu.size() >= 2, "cu_seqlens must hold at least 2 entries (0 and the token count), got ",
            cu.size());
  NSA_CHECK(cu.front() == 0, "cu_seqlens[0] = ", cu.front(), " must be 0");
  for (size_t i = 1; i < cu.size(); ++i) {
    NSA_CHECK(cu[i] >= cu[i - 1], "cu_seqlens must be non-decreasing: cu_seqlens[", i,
              "] = ", cu[i], " < cu_seqlens[", i - 1, "] = ", cu[i - 1]);
  }
  NSA_CHECK(cu.back() == total_tokens, "cu_seqlens[last] = ", cu.back(),
            " must equal the number of tokens ", total_tokens);
  return SeqLayout{cu};
}

std::vector<int64_t> SeqLayout::compressed_offsets(const NsaConfig& cfg) const {
  std::vector<int64_t> off(cu_seqlens.size(), 0);
  for (int64_t n = 0; n < num_seqs(); ++n) off[n + 1] = off[n] + cfg.num_compressed(length(n));
  return off;
}

}  // namespace nsa
