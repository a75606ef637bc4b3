// One transformer block of the CPU model, forward and backward (see model_layer_cpu.h).
#include "model_layer_cpu.h"

#include <chrono>
#include <cmath>
#include <string>

#include "cpu/ops/activations.h"
#include "cpu/ops/linear.h"
#include "cpu/ops/rmsnorm.h"
#include "cpu/ops/rope.h"
#include "nsa/memory_stats.h"

namespace nsa {
namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

template <typename Real>
Tensor<Real> reshaped(Tensor<Real> t, Shape shape) {
  NSA_CHECK(shape_numel(shape) == t.numel(), "internal reshape mismatch");
  t.shape = std::move(shape);
  return t;
}

}  // namespace

template <typename Real>
void FiniteCheck<Real>::operator()(const Tensor<Real>& t, const std::string& what) const {
  if (!stats || !stats->check_finite) return;
  for (int64_t i = 0; i < t.numel(); ++i) {
    NSA_CHECK(std::isfinite(static_cast<double>(t[i])), "anomaly: non-finite value ", t[i], " in ",
              what, " (element ", i, " of shape ", shape_str(t.shape), ")");
  }
}

// norm → q, k, v (RoPE), gates → NSA → wo + residual → norm → MLP + residual.
template <typename Real>
void layer_forward_cpu(const ModelConfig& cfg, const LayerParams<Real>& L, const SeqLayout& layout,
                       size_t li, Tensor<Real>& x, LayerActivations<Real>& A, ModelStats* stats,
                       const FiniteCheck<Real>& check) {
  const NsaConfig a = cfg.layer_attention(layout.max_length());  // attention = full: w >= S
  const int64_t T = layout.total_tokens(), H = a.heads, Gk = a.groups;
  const bool swiglu = cfg.mlp == "swiglu";
  const auto t_layer = Clock::now();
  const int64_t bytes_before = host_memory_stats().current_bytes;
  A.x = x;
  const std::string layer = "layer " + std::to_string(li) + " ";
  cpu::rmsnorm_forward(x, L.attn_norm, cfg.norm_eps, A.h1, A.rstd1);
  check(A.h1, layer + "attention_norm output");
  Tensor<Real> t;
  cpu::linear_forward(A.h1, L.wq, nullptr, t);
  A.attn_in.q = reshaped(std::move(t), {T, H, a.dk});
  cpu::rope_apply(A.attn_in.q, layout, cfg.rope_base, false);
  for (int c = 0; c < kNumBranches; ++c) {
    if (a.kv_index(c) != c) continue;
    cpu::linear_forward(A.h1, L.wk[c], nullptr, t);
    A.attn_in.k[c] = reshaped(std::move(t), {T, Gk, a.dk});
    cpu::rope_apply(A.attn_in.k[c], layout, cfg.rope_base, false);
    cpu::linear_forward(A.h1, L.wv[c], nullptr, t);
    A.attn_in.v[c] = reshaped(std::move(t), {T, Gk, a.dv});
  }
  cpu::linear_forward(A.h1, L.wg, &L.bg, t);  // [T, 3H], column h·3 + c
  Tensor<Real> logits[kNumBranches];
  for (int c = 0; c < kNumBranches; ++c) {
    logits[c] = Tensor<Real>({T, H});
    for (int64_t i = 0; i < T * H; ++i) logits[c][i] = t[i * 3 + c];
  }
  gate_activation_forward(a.gate, logits, A.gate_raw);
  for (int c = 0; c < kNumBranches; ++c) {
    A.attn_in.gate[c] = A.gate_raw[c];
    if (!cfg.branch_enabled(c)) A.attn_in.gate[c].fill(Real(0));
    if (stats) {
      double sum = 0;
      for (Real g : A.attn_in.gate[c].data) sum += static_cast<double>(g);
      stats->gate_mean[c] += sum / static_cast<double>(T * H * cfg.n_layers);
    }
  }
  A.attn_in.phi_k = L.phi_k;
  A.attn_in.phi_v = L.phi_v;
  A.attn = nsa_forward_cpu(a, layout, A.attn_in);
  if (stats && stats->keep_outputs) {
    stats->sel_idx.push_back(A.attn.sel_idx);
    Tensor<float> g({T, H, kNumBranches});
    for (int64_t i = 0; i < T * H; ++i) {
      for (int c = 0; c < kNumBranches; ++c)
        g[i * kNumBranches + c] = static_cast<float>(A.attn_in.gate[c][i]);
    }
    stats->gates.push_back(std::move(g));
  }
  if (stats && !stats->mass_queries.empty()) {
    stats->attention_mass.push_back(
        attention_mass(a, layout, A.attn_in, A.attn, stats->mass_queries));
  }
  if (stats) add_sel_distance_hist(layout, a.l_sel, A.attn.sel_idx, stats->sel_distance_hist);
  check(A.attn_in.q, layer + "queries");
  check(A.attn.o, layer + "NSA attention output");
  A.o_flat = reshaped(A.attn.o, {T, H * a.dv});
  cpu::linear_forward(A.o_flat, L.wo, nullptr, t);
  check(t, layer + "attention projection (wo) output");
  A.x2 = x;
  for (int64_t i = 0; i < A.x2.numel(); ++i) A.x2[i] += t[i];
  cpu::rmsnorm_forward(A.x2, L.ffn_norm, cfg.norm_eps, A.h2, A.rstd2);
  cpu::linear_forward(A.h2, L.w1, nullptr, A.u1);
  if (swiglu) {
    cpu::linear_forward(A.h2, L.w3, nullptr, A.u3);
    cpu::swiglu_forward(A.u1, A.u3, A.m);
  } else {
    cpu::silu_forward(A.u1, A.m);
  }
  cpu::linear_forward(A.m, L.w2, nullptr, t);
  check(t, layer + "MLP output");
  x = A.x2;
  for (int64_t i = 0; i < x.numel(); ++i) x[i] += t[i];
  if (stats) {
    t = Tensor<Real>();  // scratch, not an activation
    stats->layer_forward_ms[li] = ms_since(t_layer);
    stats->layer_bytes[li] = host_memory_stats().current_bytes - bytes_before;
  }
}

// The forward's steps in reverse: MLP, then attention (wo, NSA, gates, projections).
template <typename Real>
void layer_backward_cpu(const ModelConfig& cfg, const LayerParams<Real>& L, LayerParams<Real>& GL,
                        const SeqLayout& layout, size_t li, LayerActivations<Real>& A,
                        Tensor<Real>& dx, ModelStats* stats, const FiniteCheck<Real>& check) {
  const NsaConfig a = cfg.layer_attention(layout.max_length());  // as in the forward
  const int64_t T = layout.total_tokens(), H = a.heads, Gk = a.groups;
  const bool swiglu = cfg.mlp == "swiglu";
  const auto t_layer = Clock::now();
  // MLP.
  Tensor<Real> dm, du1, du3, dh2, dx2n;
  cpu::linear_backward(A.m, L.w2, dx, dm, false, GL.w2, nullptr);
  if (swiglu) {
    cpu::swiglu_backward(A.u1, A.u3, dm, du1, du3);
    cpu::linear_backward(A.h2, L.w1, du1, dh2, false, GL.w1, nullptr);
    cpu::linear_backward(A.h2, L.w3, du3, dh2, true, GL.w3, nullptr);
  } else {
    cpu::silu_backward(A.u1, dm, du1);
    cpu::linear_backward(A.h2, L.w1, du1, dh2, false, GL.w1, nullptr);
  }
  cpu::rmsnorm_backward(A.x2, L.ffn_norm, A.rstd2, dh2, dx2n, GL.ffn_norm);
  Tensor<Real> dx2 = dx;
  for (int64_t i = 0; i < dx2.numel(); ++i) dx2[i] += dx2n[i];
  // Attention.
  Tensor<Real> do_flat;
  cpu::linear_backward(A.o_flat, L.wo, dx2, do_flat, false, GL.wo, nullptr);
  NsaTensors<Real> d_in =
      nsa_backward_cpu(a, layout, A.attn_in, A.attn, reshaped(std::move(do_flat), {T, H, a.dv}));
  Tensor<Real> dlogit_gate[kNumBranches];
  for (int c = 0; c < kNumBranches; ++c) {
    if (!cfg.branch_enabled(c)) d_in.gate[c].fill(Real(0));  // a forced gate is a constant
  }
  gate_activation_backward(a.gate, A.gate_raw, d_in.gate, dlogit_gate);
  Tensor<Real> dz({T, 3 * H}), dh1;
  for (int c = 0; c < kNumBranches; ++c) {
    for (int64_t i = 0; i < T * H; ++i) dz[i * 3 + c] = dlogit_gate[c][i];
  }
  cpu::linear_backward(A.h1, L.wg, dz, dh1, false, GL.wg, &GL.bg);
  cpu::rope_apply(d_in.q, layout, cfg.rope_base, true);
  cpu::linear_backward(A.h1, L.wq, reshaped(std::move(d_in.q), {T, H * a.dk}), dh1, true, GL.wq,
                       nullptr);
  for (int c = 0; c < kNumBranches; ++c) {
    if (a.kv_index(c) != c) continue;
    cpu::rope_apply(d_in.k[c], layout, cfg.rope_base, true);
    cpu::linear_backward(A.h1, L.wk[c], reshaped(std::move(d_in.k[c]), {T, Gk * a.dk}), dh1, true,
                         GL.wk[c], nullptr);
    cpu::linear_backward(A.h1, L.wv[c], reshaped(std::move(d_in.v[c]), {T, Gk * a.dv}), dh1, true,
                         GL.wv[c], nullptr);
  }
  if (a.phi == Phi::kMlp) {
    for (auto [g, d] : {std::pair{&GL.phi_k, &d_in.phi_k}, std::pair{&GL.phi_v, &d_in.phi_v}}) {
      for (auto [gt, dt] :
           {std::pair{&g->pos, &d->pos}, std::pair{&g->w1, &d->w1}, std::pair{&g->b1, &d->b1},
            std::pair{&g->w2, &d->w2}, std::pair{&g->b2, &d->b2}}) {
        for (int64_t i = 0; i < gt->numel(); ++i) (*gt)[i] += (*dt)[i];
      }
    }
  }
  Tensor<Real> dxn;
  cpu::rmsnorm_backward(A.x, L.attn_norm, A.rstd1, dh1, dxn, GL.attn_norm);
  dx = std::move(dx2);
  for (int64_t i = 0; i < dx.numel(); ++i) dx[i] += dxn[i];
  check(dx, "the gradient of layer " + std::to_string(li) + "'s input");
  if (stats) stats->layer_backward_ms[li] = ms_since(t_layer);
}

#define NSA_INSTANTIATE_LAYER_CPU(Real)                                                           \
  template struct FiniteCheck<Real>;                                                              \
  template void layer_forward_cpu<Real>(                                                          \
      const ModelConfig&, const LayerParams<Real>&, const SeqLayout&, size_t, Tensor<Real>&,      \
      LayerActivations<Real>&, ModelStats*, const FiniteCheck<Real>&);                            \
  template void layer_backward_cpu<Real>(                                                         \
      const ModelConfig&, const LayerParams<Real>&, LayerParams<Real>&, const SeqLayout&, size_t, \
      LayerActivations<Real>&, Tensor<Real>&, ModelStats*, const FiniteCheck<Real>&);
NSA_INSTANTIATE_LAYER_CPU(float)
NSA_INSTANTIATE_LAYER_CPU(double)

}  // namespace nsa
