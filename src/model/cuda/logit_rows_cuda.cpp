// The GPU model's logits at chosen rows (see logit_rows_cuda.h).
#include "logit_rows_cuda.h"

#include "model_cuda.h"

namespace nsa::cuda {

std::vector<float> logit_rows_cuda(const ModelConfig& cfg, const ModelParams<float>& params,
                                   const SeqLayout& layout, const std::vector<int32_t>& inputs,
                                   const std::vector<int32_t>& targets,
                                   const std::vector<int64_t>& rows, ProbeRows* probe) {
  ModelCuda model(cfg, layout, Recompute::kLayers);  // forward only: one workspace is enough
  ModelParams<float> copy = params;                  // set_params reads through mutable views
  model.set_params(copy);
  model.keep_logits(true);
  // The probe: every layer's selection and gates downloaded as the pass goes (keep_outputs).
  ModelStats stats;
  stats.keep_outputs = probe != nullptr;
  model.forward_backward(inputs, targets, /*backward=*/false, probe ? &stats : nullptr);
  std::vector<float> out;
  model.download_logit_rows(rows, out);
  if (probe) *probe = gather_probe_rows(stats, rows);
  return out;
}

}  // namespace nsa::cuda
