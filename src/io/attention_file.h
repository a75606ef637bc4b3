// The `nsa attention` interop contract (docs/interop.md): NSA inputs in a safetensors file, NSA
// outputs, selected indices and gradients out.
//
// Inputs: q [B,S,H,dk]; k_cmp, v_cmp, k_sel, v_sel, k_win, v_win [B,S,G,dk|dv] (or k, v when kv =
// shared); g_cmp, g_sel, g_win [B,S,H] gate values; optional cu_seqlens I32/I64 [N+1] (B = 1);
// optional do [B,S,H,dv]; φ = mlp parameters phi_{k,v}_{pos,w1,b1,w2,b2}. Hyper-parameters l, d,
// l_sel, n_sel, w (and optional scale, phi, kv) in __metadata__, overridable from the command line.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "nsa/attention.h"
#include "safetensors.h"

namespace nsa::io {

struct AttentionProblem {
  NsaConfig cfg;
  SeqLayout layout;
  int64_t batch = 0;     // B
  int64_t seq_len = 0;   // S (per batch row; the packed total when cu_seqlens is given)
  NsaTensors<float> in;  // tensors with the token dims flattened: [T, ...]
  bool has_do = false;
  Tensor<float> d_o;  // [T, H, dv] when has_do
};

// Reads and validates the problem; `overrides` (field -> value) replace __metadata__ entries.
AttentionProblem load_attention_problem(const SafetensorsFile& file,
                                        const std::map<std::string, std::string>& overrides);

// Writes o, o_cmp, o_sel, o_win, lse_*, sel_idx and, when grads != nullptr, d<input name>.
void save_attention_result(const std::string& path, const AttentionProblem& p,
                           const NsaForward<float>& fwd, const NsaTensors<float>* grads);

// A random, valid input file (unit-norm-ish q/k, gate values in (0, 1), do included) for demos.
SafetensorsFile make_example_problem(const NsaConfig& cfg, int64_t batch, int64_t seq_len,
                                     uint64_t seed);

}  // namespace nsa::io
