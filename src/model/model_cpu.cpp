// The NSA language model on the CPU (see model_cpu.h).
#include "model_cpu.h"

#include <vector>

#include "cpu/ops/cross_entropy.h"
#include "cpu/ops/embedding.h"
#include "cpu/ops/linear.h"
#include "cpu/ops/rmsnorm.h"
#include "model_layer_cpu.h"

namespace nsa {

void add_sel_distance_hist(const SeqLayout& layout, int64_t l_sel, const Tensor<int32_t>& sel_idx,
                           int64_t (&hist)[16]) {
  const int64_t per_row = sel_idx.shape.size() == 3 ? sel_idx.shape[1] * sel_idx.shape[2] : 0;
  NSA_CHECK(per_row > 0 && sel_idx.shape[0] == layout.total_tokens(), "sel_idx of shape ",
            shape_str(sel_idx.shape), " for ", layout.total_tokens(), " tokens");
  for (int64_t n = 0; n < layout.num_seqs(); ++n) {
    for (int64_t t = 0; t < layout.length(n); ++t) {
      const int64_t c = t / l_sel;
      const int32_t* sel = sel_idx.ptr() + (layout.start(n) + t) * per_row;
      for (int64_t k = 0; k < per_row; ++k) {
        const int64_t dist = c - sel[k];
        if (sel[k] <= 0 || dist < 2) continue;  // padding and forced blocks (0, c−1, c)
        int bucket = 0;
        while (bucket < 15 && (int64_t{2} << bucket) <= dist) ++bucket;
        ++hist[bucket];
      }
    }
  }
}

// Embedding → blocks (model_layer_cpu.h) → final norm → head → cross-entropy, then the same in
// reverse for the gradients.
template <typename Real>
double model_loss_cpu(const ModelConfig& cfg, const ModelParams<Real>& P, const SeqLayout& layout,
                      const std::vector<int32_t>& tokens, const std::vector<int32_t>& targets,
                      std::type_identity_t<ModelParams<Real>>* G_, ModelStats* stats) {
  cfg.validate();
  if (stats) {
    const bool keep = stats->keep_outputs, check = stats->check_finite;
    const bool keep_losses = stats->keep_token_losses;
    std::vector<MassQuery> mass_queries = std::move(stats->mass_queries);
    *stats = ModelStats{};
    stats->keep_outputs = keep;
    stats->check_finite = check;
    stats->keep_token_losses = keep_losses;
    stats->mass_queries = std::move(mass_queries);
  }
  const FiniteCheck<Real> check{stats};
  const int64_t T = layout.total_tokens();
  NSA_CHECK(static_cast<int64_t>(tokens.size()) == T && static_cast<int64_t>(targets.size()) == T,
            "model: ", tokens.size(), " tokens and ", targets.size(), " targets for a layout of ",
            T);
  const Tensor<Real>& head = cfg.tie_embeddings ? P.tok_emb : P.output;
  if (stats) {
    stats->layer_forward_ms.assign(P.layers.size(), 0.0);
    stats->layer_backward_ms.assign(P.layers.size(), 0.0);
    stats->layer_bytes.assign(P.layers.size(), 0);
  }

  Tensor<Real> x;
  cpu::embedding_forward(tokens, P.tok_emb, x);
  check(x, "the token embedding output");
  std::vector<LayerActivations<Real>> acts(P.layers.size());
  for (size_t li = 0; li < P.layers.size(); ++li) {
    layer_forward_cpu(cfg, P.layers[li], layout, li, x, acts[li], stats, check);
  }
  Tensor<Real> hf, rstdf, logits;
  cpu::rmsnorm_forward(x, P.norm, cfg.norm_eps, hf, rstdf);
  cpu::linear_forward(hf, head, nullptr, logits);
  check(logits, "the logits");
  if (stats && stats->keep_outputs) stats->logits = logits.template cast<float>();
  Tensor<Real> dlogits;
  const double loss =
      cpu::cross_entropy(logits, targets, G_ ? &dlogits : nullptr,
                         stats && stats->keep_token_losses ? &stats->token_loss : nullptr);
  if (!G_) return loss;

  // Backward.
  ModelParams<Real>& G = *G_;
  Tensor<Real> dhf, dx;
  cpu::linear_backward(hf, head, dlogits, dhf, false, cfg.tie_embeddings ? G.tok_emb : G.output,
                       nullptr);
  cpu::rmsnorm_backward(x, P.norm, rstdf, dhf, dx, G.norm);
  for (size_t li = P.layers.size(); li-- > 0;) {
    layer_backward_cpu(cfg, P.layers[li], G.layers[li], layout, li, acts[li], dx, stats, check);
  }
  cpu::embedding_backward(tokens, dx, G.tok_emb);
  if (stats && stats->check_finite) {
    for (const auto& [name, tensor] : G.named(cfg)) check(*tensor, "the gradient of " + name);
  }
  return loss;
}

template double model_loss_cpu<float>(const ModelConfig&, const ModelParams<float>&,
                                      const SeqLayout&, const std::vector<int32_t>&,
                                      const std::vector<int32_t>&, ModelParams<float>*,
                                      ModelStats*);
template double model_loss_cpu<double>(const ModelConfig&, const ModelParams<double>&,
                                       const SeqLayout&, const std::vector<int32_t>&,
                                       const std::vector<int32_t>&, ModelParams<double>*,
                                       ModelStats*);

namespace {

// Rows `rows` of [T, …] tensors, one per layer, each row's trailing dims kept.
template <typename T>
std::vector<std::vector<T>> gather_rows(const std::vector<Tensor<T>>& per_layer,
                                        const std::vector<int64_t>& rows, const char* what) {
  std::vector<std::vector<T>> out;
  for (const Tensor<T>& x : per_layer) {
    NSA_CHECK(x.shape.size() == 3, "gather_probe_rows: a layer's ", what, " is not 3-D");
    const int64_t per_row = x.shape[1] * x.shape[2];
    std::vector<T>& layer = out.emplace_back();
    for (const int64_t r : rows) {
      NSA_CHECK(r >= 0 && r < x.shape[0], "gather_probe_rows: row ", r, " outside [0, ", x.shape[0],
                ")");
      layer.insert(layer.end(), x.ptr() + r * per_row, x.ptr() + (r + 1) * per_row);
    }
  }
  return out;
}

}  // namespace

ProbeRows gather_probe_rows(const ModelStats& stats, const std::vector<int64_t>& rows) {
  ProbeRows out;
  out.sel = gather_rows(stats.sel_idx, rows, "selection");
  out.gates = gather_rows(stats.gates, rows, "gates");
  out.mass = stats.attention_mass;
  return out;
}

}  // namespace nsa
