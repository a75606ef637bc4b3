// The GPU model's logits at chosen rows (see logit_rows_cuda.h).
#include "logit_rows_cuda.h"

#include "model/model_cpu.h"
#include "model_cuda.h"

namespace nsa::cuda {

std::vector<float> logit_rows_cuda(const ModelConfig& cfg, const ModelParams<float>& params,
                                   const SeqLayout& layout, const std::vector<int32_t>& inputs,
                                   const std::vector<int32_t>& targets,
                                   const std::vector<int64_t>& rows,
                                   std::vector<std::vector<int32_t>>* sel_rows) {
  ModelCuda model(cfg, layout, Recompute::kLayers);  // forward only: one workspace is enough
  ModelParams<float> copy = params;                  // set_params reads through mutable views
  model.set_params(copy);
  model.keep_logits(true);
  // The probe: every layer's selection downloaded as the pass goes (keep_outputs).
  ModelStats stats;
  stats.keep_outputs = sel_rows != nullptr;
  model.forward_backward(inputs, targets, /*backward=*/false, sel_rows ? &stats : nullptr);
  std::vector<float> out;
  model.download_logit_rows(rows, out);
  if (sel_rows) *sel_rows = gather_selection_rows(stats.sel_idx, rows);
  return out;
}

}  // namespace nsa::cuda
