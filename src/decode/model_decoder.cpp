// Incremental decoding (see model_decoder.h). Every dense op is the one the full model uses, on a
// single row, so each element is computed in the same order as in the full forward.
#include "model_decoder.h"

#include "cpu/ops/activations.h"
#include "cpu/ops/embedding.h"
#include "cpu/ops/linear.h"
#include "cpu/ops/rmsnorm.h"
#include "cpu/ops/rope.h"
#include "model/model_layer_cpu.h"
#include "prefill_plan.h"

namespace nsa {

ModelDecoder::ModelDecoder(const ModelConfig& cfg, const ModelParams<float>& params,
                           int64_t max_len)
    : cfg_(cfg), p_(params), max_len_(max_len) {
  cfg.validate();
  NSA_CHECK(max_len >= 0, "decode: max length ", max_len, " must be >= 0 (0: unbounded)");
  NSA_CHECK(cfg.attention != "full" || max_len > 0,
            "decode: attention = full needs the decoder's maximum length (its window covers every "
            "position)");
  for (int64_t i = 0; i < cfg.n_layers; ++i) caches_.emplace_back(cfg.layer_attention(max_len));
  sel_.assign(static_cast<size_t>(cfg.n_layers), {});
}

int64_t ModelDecoder::last_step_kv_bytes() const {
  int64_t total = 0;
  for (const auto& c : caches_) total += c.last_step_kv_bytes();
  return total;
}

std::vector<float> ModelDecoder::prefill(const std::vector<int32_t>& prompt) {
  NSA_CHECK(pos_ == 0, "prefill needs a fresh decoder (this one is at position ", pos_, ")");
  check_prompt(prompt, 0, cfg_.vocab_size, max_len_ > 0 ? max_len_ : int64_t{1} << 31);
  const NsaConfig& a = cfg_.attn;
  const int64_t S = static_cast<int64_t>(prompt.size()), D = cfg_.dim, G = a.groups;
  const SeqLayout layout = SeqLayout::batch(1, S);
  Tensor<float> x;
  cpu::embedding_forward(prompt, p_.tok_emb, x);
  for (size_t li = 0; li < p_.layers.size(); ++li) {
    const LayerParams<float>& L = p_.layers[li];
    LayerActivations<float> A;  // one layer's at a time: nothing is kept for a backward
    layer_forward_cpu(cfg_, L, layout, li, x, A, nullptr, FiniteCheck<float>{});
    caches_[li].prefill(A.attn_in.k, A.attn_in.v, &L.phi_k, &L.phi_v);
    const int32_t* last = A.attn.sel_idx.ptr() + (S - 1) * G * a.n_sel;
    sel_[li].assign(last, last + G * a.n_sel);
  }
  // The final norm and the head on the last position only: per row, the ops step() runs.
  Tensor<float> x_last({1, D}), hf, rstdf, logits;
  std::copy_n(x.ptr() + (S - 1) * D, D, x_last.ptr());
  cpu::rmsnorm_forward(x_last, p_.norm, cfg_.norm_eps, hf, rstdf);
  cpu::linear_forward(hf, cfg_.tie_embeddings ? p_.tok_emb : p_.output, nullptr, logits);
  pos_ = S;
  return std::vector<float>(logits.data.begin(), logits.data.end());
}

std::vector<float> ModelDecoder::step(int32_t token) {
  NSA_CHECK(max_len_ == 0 || pos_ < max_len_, "decode: the caches hold ", max_len_,
            " tokens; position ", pos_, " is beyond them");
  const NsaConfig& a = cfg_.attn;
  const int64_t H = a.heads, G = a.groups;
  const SeqLayout one = SeqLayout::batch(1, 1);
  Tensor<float> x, h, rstd, t;
  cpu::embedding_forward({token}, p_.tok_emb, x);
  for (size_t li = 0; li < p_.layers.size(); ++li) {
    const LayerParams<float>& L = p_.layers[li];
    cpu::rmsnorm_forward(x, L.attn_norm, cfg_.norm_eps, h, rstd);
    Tensor<float> q;
    cpu::linear_forward(h, L.wq, nullptr, q);
    q.shape = {1, H, a.dk};
    cpu::rope_apply(q, one, cfg_.rope_base, false, pos_);
    Tensor<float> k[kNumBranches], v[kNumBranches];
    const float* kp[kNumBranches];
    const float* vp[kNumBranches];
    for (int c = 0; c < kNumBranches; ++c) {
      if (a.kv_index(c) == c) {
        cpu::linear_forward(h, L.wk[c], nullptr, k[c]);
        k[c].shape = {1, G, a.dk};
        cpu::rope_apply(k[c], one, cfg_.rope_base, false, pos_);
        cpu::linear_forward(h, L.wv[c], nullptr, v[c]);
      }
    }
    for (int c = 0; c < kNumBranches; ++c) {
      kp[c] = k[a.kv_index(c)].ptr();
      vp[c] = v[a.kv_index(c)].ptr();
    }
    cpu::linear_forward(h, L.wg, &L.bg, t);
    Tensor<float> logits[kNumBranches], gates[kNumBranches];
    for (int c = 0; c < kNumBranches; ++c) {
      logits[c] = Tensor<float>({1, H});
      for (int64_t i = 0; i < H; ++i) logits[c][i] = t[i * 3 + c];
    }
    gate_activation_forward(a.gate, logits, gates);
    const float* gp[kNumBranches];
    for (int c = 0; c < kNumBranches; ++c) {
      if (!cfg_.branch_enabled(c)) gates[c].fill(0.0f);
      gp[c] = gates[c].ptr();
    }
    Tensor<float> o({1, H * a.dv});
    sel_[li].resize(static_cast<size_t>(G * a.n_sel));
    caches_[li].step(q.ptr(), kp, vp, gp, &L.phi_k, &L.phi_v, o.ptr(), sel_[li].data());
    cpu::linear_forward(o, L.wo, nullptr, t);
    Tensor<float> x2 = x;
    for (int64_t i = 0; i < x2.numel(); ++i) x2[i] += t[i];
    Tensor<float> h2, rstd2, u1, u3, m;
    cpu::rmsnorm_forward(x2, L.ffn_norm, cfg_.norm_eps, h2, rstd2);
    cpu::linear_forward(h2, L.w1, nullptr, u1);
    if (cfg_.mlp == "swiglu") {
      cpu::linear_forward(h2, L.w3, nullptr, u3);
      cpu::swiglu_forward(u1, u3, m);
    } else {
      cpu::silu_forward(u1, m);
    }
    cpu::linear_forward(m, L.w2, nullptr, t);
    x = x2;
    for (int64_t i = 0; i < x.numel(); ++i) x[i] += t[i];
  }
  Tensor<float> hf, rstdf, logits;
  cpu::rmsnorm_forward(x, p_.norm, cfg_.norm_eps, hf, rstdf);
  cpu::linear_forward(hf, cfg_.tie_embeddings ? p_.tok_emb : p_.output, nullptr, logits);
  ++pos_;
  return std::vector<float>(logits.data.begin(), logits.data.end());
}

}  // namespace nsa
