// The GPU model's logits at chosen rows (see logit_rows_cuda.h).
#include "logit_rows_cuda.h"

#include <memory>

#include "forward_model_cuda.h"
#include "model_cuda.h"

namespace nsa::cuda {
namespace {

// The one forward behind both entry points, on a model built for the inputs' layout.
std::vector<float> logit_rows_of(ModelCuda& model, const std::vector<int32_t>& inputs,
                                 const std::vector<int32_t>& targets,
                                 const std::vector<int64_t>& rows, ProbeRows* probe) {
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

}  // namespace

std::vector<float> logit_rows_cuda(const ModelConfig& cfg, const ModelParams<float>& params,
                                   const SeqLayout& layout, const std::vector<int32_t>& inputs,
                                   const std::vector<int32_t>& targets,
                                   const std::vector<int64_t>& rows, ProbeRows* probe) {
  ForwardModelCuda model(cfg, params);
  return logit_rows_of(model.at(layout), inputs, targets, rows, probe);
}

LogitRowsFn make_logit_rows_cuda() {
  auto model = std::make_shared<ForwardModelCuda>();
  return [model](const ModelConfig& cfg, const ModelParams<float>& params, const SeqLayout& layout,
                 const std::vector<int32_t>& inputs, const std::vector<int32_t>& targets,
                 const std::vector<int64_t>& rows, ProbeRows* probe) {
    return logit_rows_of(model->at(cfg, params, layout), inputs, targets, rows, probe);
  };
}

}  // namespace nsa::cuda
