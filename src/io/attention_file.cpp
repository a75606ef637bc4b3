// Mapping between safetensors files and NSA attention tensors (see attention_file.h).
#include "attention_file.h"

#include <cmath>
#include <iomanip>
#include <set>

#include "nsa/error.h"
#include "nsa/size_limits.h"

namespace nsa::io {
namespace {

const char* kPhiParts[] = {"pos", "w1", "b1", "w2", "b2"};

Tensor<float>* phi_part(PhiMlpParams<float>& p, int i) {
  Tensor<float>* parts[] = {&p.pos, &p.w1, &p.b1, &p.w2, &p.b2};
  return parts[i];
}

std::string kv_tensor_name(const NsaConfig& cfg, char kind, int branch) {
  return cfg.kv == KvMode::kShared ? std::string(1, kind)
                                   : std::string(1, kind) + "_" + kBranchNames[branch];
}

// NaN or Inf in an input would flow silently into some outputs (o all NaN) and not others
// (gradients that stay 0): such a file is refused, naming the tensor and the first bad element.
void check_finite(const Tensor<float>& t, const std::string& name, const std::string& file) {
  for (int64_t i = 0; i < t.numel(); ++i) {
    NSA_CHECK(std::isfinite(t[i]), "tensor '", name, "' in '", file, "' holds ", t[i],
              " at flat index ", i, ": NSA inputs must be finite");
  }
}

// Reads `name`, checks its rank and leading [B, S] dims, returns it as [B·S, rest...].
Tensor<float> read_tokens(const SafetensorsFile& f, const std::string& name, int64_t B, int64_t S,
                          size_t rank) {
  NSA_CHECK(f.has(name), "input file '", f.path(), "' has no tensor '", name, "'");
  Tensor<float> t = f.get_float(name);
  NSA_CHECK(t.shape.size() == rank && t.shape[0] == B && t.shape[1] == S, "tensor '", name,
            "' has shape ", shape_str(t.shape), ", expected ", rank, " dims starting with [", B,
            ",", S, "]");
  check_finite(t, name, f.path());
  Shape flat = {B * S};
  flat.insert(flat.end(), t.shape.begin() + 2, t.shape.end());
  t.shape = flat;
  return t;
}

// The hyper-parameters as __metadata__ strings (what load_attention_problem reads back).
std::map<std::string, std::string> config_metadata(const NsaConfig& cfg) {
  return {{"l", std::to_string(cfg.l)},
          {"d", std::to_string(cfg.d)},
          {"l_sel", std::to_string(cfg.l_sel)},
          {"n_sel", std::to_string(cfg.n_sel)},
          {"w", std::to_string(cfg.w)},
          {"phi", to_string(cfg.phi)},
          {"kv", to_string(cfg.kv)}};
}

Tensor<float> unflatten(Tensor<float> t, int64_t B, int64_t S) {
  Shape s = {B, S};
  s.insert(s.end(), t.shape.begin() + 1, t.shape.end());
  t.shape = s;
  return t;
}

}  // namespace

AttentionProblem load_attention_problem(const SafetensorsFile& file,
                                        const std::map<std::string, std::string>& overrides) {
  std::map<std::string, std::string> meta = file.metadata;
  for (const auto& [k, v] : overrides) meta[k] = v;
  AttentionProblem p;
  NsaConfig& cfg = p.cfg;
  for (const char* field : {"l", "d", "l_sel", "n_sel", "w"}) {
    NSA_CHECK(meta.count(field), "hyper-parameter '", field, "' is missing: put it in the ",
              "__metadata__ of '", file.path(), "' or pass it as a flag");
  }
  // Other metadata keys (a writer's "format", say) are not ours and are ignored.
  for (const char* field : {"l", "d", "l_sel", "n_sel", "w", "scale", "phi", "kv"}) {
    if (meta.count(field)) set_config_field(cfg, field, meta[field]);
  }
  NSA_CHECK(file.has("q"), "input file '", file.path(), "' has no tensor 'q'");
  const Shape qs = file.at("q").shape;
  NSA_CHECK(qs.size() == 4, "tensor 'q' has shape ", shape_str(qs), ", expected [B,S,H,dk]");
  p.batch = qs[0];
  p.seq_len = qs[1];
  cfg.heads = qs[2];
  cfg.dk = qs[3];
  const std::string k0 = kv_tensor_name(cfg, 'k', kCmp), v0 = kv_tensor_name(cfg, 'v', kCmp);
  NSA_CHECK(file.has(k0), "input file '", file.path(), "' has no tensor '", k0, "'",
            cfg.kv == KvMode::kSeparate ? " (for one shared K/V set kv = shared)" : "");
  NSA_CHECK(file.has(v0), "input file '", file.path(), "' has no tensor '", v0, "'");
  NSA_CHECK(file.at(k0).shape.size() == 4 && file.at(v0).shape.size() == 4, "tensors '", k0,
            "' and '", v0, "' must be [B,S,G,dk] and [B,S,G,dv]");
  cfg.groups = file.at(k0).shape[2];
  cfg.dv = file.at(v0).shape[3];
  if (cfg.phi == Phi::kMlp) {
    NSA_CHECK(file.has("phi_k_w1"), "phi = mlp needs tensor 'phi_k_w1' in '", file.path(), "'");
    const Shape w1 = file.at("phi_k_w1").shape;
    NSA_CHECK(w1.size() == 2, "tensor 'phi_k_w1' must be [l*dk, hidden], got ", shape_str(w1));
    cfg.phi_hidden = w1[1];
  }
  cfg.validate();

  const int64_t B = p.batch, S = p.seq_len;
  if (file.has("cu_seqlens")) {
    NSA_CHECK(B == 1, "with cu_seqlens (packed documents) the batch dim must be 1, got B = ", B);
    p.layout = SeqLayout::packed(file.get_int("cu_seqlens"), S);
  } else {
    p.layout = SeqLayout::batch(B, S);
  }
  p.in.q = read_tokens(file, "q", B, S, 4);
  for (int c = 0; c < kNumBranches; ++c) {
    const int kv = cfg.kv_index(c);
    if (kv == c) {
      p.in.k[c] = read_tokens(file, kv_tensor_name(cfg, 'k', c), B, S, 4);
      p.in.v[c] = read_tokens(file, kv_tensor_name(cfg, 'v', c), B, S, 4);
    }
    p.in.gate[c] = read_tokens(file, std::string("g_") + kBranchNames[c], B, S, 3);
  }
  if (cfg.phi == Phi::kMlp) {
    for (int i = 0; i < 5; ++i) {
      for (auto [prefix, params] :
           {std::pair<const char*, PhiMlpParams<float>*>{"phi_k_", &p.in.phi_k},
            {"phi_v_", &p.in.phi_v}}) {
        const std::string name = std::string(prefix) + kPhiParts[i];
        NSA_CHECK(file.has(name), "phi = mlp needs tensor '", name, "' in '", file.path(), "'");
        *phi_part(*params, i) = file.get_float(name);
        check_finite(*phi_part(*params, i), name, file.path());
      }
    }
  }
  check_inputs(cfg, p.layout, p.in);
  p.has_do = file.has("do");
  if (p.has_do) {
    p.d_o = read_tokens(file, "do", B, S, 4);
    check_shape(p.d_o, {B * S, cfg.heads, cfg.dv}, "do");
  }
  std::set<std::string> expected = {"q", "do", "cu_seqlens"};
  for (int c = 0; c < kNumBranches; ++c) {
    expected.insert(kv_tensor_name(cfg, 'k', c));
    expected.insert(kv_tensor_name(cfg, 'v', c));
    expected.insert(std::string("g_") + kBranchNames[c]);
  }
  for (int i = 0; cfg.phi == Phi::kMlp && i < 5; ++i) {
    expected.insert(std::string("phi_k_") + kPhiParts[i]);
    expected.insert(std::string("phi_v_") + kPhiParts[i]);
  }
  for (const std::string& name : file.names()) {
    NSA_CHECK(expected.count(name), "input file '", file.path(), "' has an unexpected tensor '",
              name, "' for kv = ", to_string(cfg.kv), ", phi = ", to_string(cfg.phi),
              " (see docs/interop.md for the names)");
  }
  return p;
}

void save_attention_result(const std::string& path, const AttentionProblem& p,
                           const NsaForward<float>& fwd, const NsaTensors<float>* grads) {
  const NsaConfig& cfg = p.cfg;
  const int64_t B = p.batch, S = p.seq_len;
  SafetensorsFile out;
  out.metadata = config_metadata(cfg);
  out.metadata["scale"] = str(std::setprecision(17), cfg.softmax_scale());
  out.put("o", unflatten(fwd.o, B, S));
  for (int c = 0; c < kNumBranches; ++c) {
    out.put(std::string("o_") + kBranchNames[c], unflatten(fwd.o_branch[c], B, S));
    out.put(std::string("lse_") + kBranchNames[c], unflatten(fwd.lse[c], B, S));
  }
  Tensor<int32_t> sel = fwd.sel_idx;
  sel.shape = {B, S, cfg.groups, cfg.n_sel};
  out.put("sel_idx", sel);
  if (grads) {
    out.put("dq", unflatten(grads->q, B, S));
    for (int c = 0; c < kNumBranches; ++c) {
      if (cfg.kv_index(c) == c) {
        out.put("d" + kv_tensor_name(cfg, 'k', c), unflatten(grads->k[c], B, S));
        out.put("d" + kv_tensor_name(cfg, 'v', c), unflatten(grads->v[c], B, S));
      }
      out.put(std::string("dg_") + kBranchNames[c], unflatten(grads->gate[c], B, S));
    }
    if (cfg.phi == Phi::kMlp) {
      PhiMlpParams<float> dk = grads->phi_k, dv = grads->phi_v;
      for (int i = 0; i < 5; ++i) {
        out.put(std::string("dphi_k_") + kPhiParts[i], *phi_part(dk, i));
        out.put(std::string("dphi_v_") + kPhiParts[i], *phi_part(dv, i));
      }
    }
  }
  out.write(path);
}

SafetensorsFile make_example_problem(const NsaConfig& cfg, int64_t B, int64_t S, uint64_t seed) {
  cfg.validate();
  NSA_CHECK(B >= 1 && B <= (1 << 30), "--batch = ", B, " must be in [1, 1073741824]");
  NSA_CHECK(S >= 1 && S <= 2147483647, "--seq-len = ", S, " must be in [1, 2147483647]");
  // Per token: q, three K/V pairs, three gates and do, held twice (tensors and file).
  const std::string what = str("an example of B = ", B, ", S = ", S);
  const int64_t per_token = checked_product({cfg.heads, cfg.dk + 2 * cfg.dv + 3}, what) +
                            checked_product({6, cfg.groups, cfg.dk + cfg.dv}, what);
  check_memory(checked_product({B, S, per_token, 8}, what), what);
  NsaTensors<float> in = random_nsa_inputs<float>(cfg, B * S, seed);
  SafetensorsFile f;
  f.put("q", unflatten(in.q, B, S));
  for (int c = 0; c < kNumBranches; ++c) {
    if (cfg.kv_index(c) == c) {
      f.put(kv_tensor_name(cfg, 'k', c), unflatten(in.k[c], B, S));
      f.put(kv_tensor_name(cfg, 'v', c), unflatten(in.v[c], B, S));
    }
    f.put(std::string("g_") + kBranchNames[c], unflatten(in.gate[c], B, S));
  }
  for (int i = 0; cfg.phi == Phi::kMlp && i < 5; ++i) {
    f.put(std::string("phi_k_") + kPhiParts[i], *phi_part(in.phi_k, i));
    f.put(std::string("phi_v_") + kPhiParts[i], *phi_part(in.phi_v, i));
  }
  // The output gradient: an independent draw with the shape of o.
  NsaConfig do_cfg = cfg;
  do_cfg.dk = cfg.dv;
  f.put("do", unflatten(random_nsa_inputs<float>(do_cfg, B * S, seed + 1).q, B, S));
  f.metadata = config_metadata(cfg);
  return f;
}

}  // namespace nsa::io
