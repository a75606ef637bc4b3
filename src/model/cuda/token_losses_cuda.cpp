// The GPU model's per-token losses (see token_losses_cuda.h).
#include "token_losses_cuda.h"

#include <memory>

#include "forward_model_cuda.h"
#include "model_cuda.h"

namespace nsa::cuda {
namespace {

// The one forward behind both entry points, on a model built for the inputs' layout.
std::vector<double> token_losses_of(ModelCuda& model, const std::vector<int32_t>& inputs,
                                    const std::vector<int32_t>& targets) {
  model.forward_backward(inputs, targets, /*backward=*/false);
  std::vector<float> loss;
  model.download_token_losses(loss);
  return std::vector<double>(loss.begin(), loss.end());
}

}  // namespace

std::vector<double> token_losses_cuda(const ModelConfig& cfg, const ModelParams<float>& params,
                                      const SeqLayout& layout, const std::vector<int32_t>& inputs,
                                      const std::vector<int32_t>& targets) {
  ForwardModelCuda model(cfg, params);
  return token_losses_of(model.at(layout), inputs, targets);
}

TokenLossesFn make_token_losses_cuda() {
  auto model = std::make_shared<ForwardModelCuda>();
  return [model](const ModelConfig& cfg, const ModelParams<float>& params, const SeqLayout& layout,
                 const std::vector<int32_t>& inputs, const std::vector<int32_t>& targets) {
    return token_losses_of(model->at(cfg, params, layout), inputs, targets);
  };
}

}  // namespace nsa::cuda
