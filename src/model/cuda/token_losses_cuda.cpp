// The GPU model's per-token losses (see token_losses_cuda.h).
#include "token_losses_cuda.h"

#include "model_cuda.h"

namespace nsa::cuda {

std::vector<double> token_losses_cuda(const ModelConfig& cfg, const ModelParams<float>& params,
                                      const SeqLayout& layout, const std::vector<int32_t>& inputs,
                                      const std::vector<int32_t>& targets) {
  ModelCuda model(cfg, layout, Recompute::kLayers);  // forward only: one workspace is enough
  ModelParams<float> copy = params;                  // set_params reads through mutable views
  model.set_params(copy);
  model.forward_backward(inputs, targets, /*backward=*/false);
  std::vector<float> loss;
  model.download_token_losses(loss);
  return std::vector<double>(loss.begin(), loss.end());
}

}  // namespace nsa::cuda
