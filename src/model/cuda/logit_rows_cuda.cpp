// The GPU model's logits at chosen rows (see logit_rows_cuda.h).
#include "logit_rows_cuda.h"

#include "model_cuda.h"

namespace nsa::cuda {

std::vector<float> logit_rows_cuda(const ModelConfig& cfg, const ModelParams<float>& params,
                                   const SeqLayout& layout, const std::vector<int32_t>& inputs,
                                   const std::vector<int32_t>& targets,
                                   const std::vector<int64_t>& rows) {
  ModelCuda model(cfg, layout, Recompute::kLayers);  // forward only: one workspace is enough
  ModelParams<float> copy = params;                  // set_params reads through mutable views
  model.set_params(copy);
  model.keep_logits(true);
  model.forward_backward(inputs, targets, /*backward=*/false);
  std::vector<float> out;
  model.download_logit_rows(rows, out);
  return out;
}

}  // namespace nsa::cuda
