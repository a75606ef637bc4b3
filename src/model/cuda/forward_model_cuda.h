// One GPU model kept for many forward-only evaluations, rebuilt only when the layout changes.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "model/cuda/model_cuda.h"
#include "model/model_params.h"
#include "nsa/model_config.h"

namespace nsa::cuda {

// Serves one model's parameters: `params` is read (and uploaded) whenever the model is built, so
// it must outlive this object and must not change between calls. at(layout) returns the model for
// `layout` (Recompute::kLayers: forward only, one workspace), building it and uploading the
// parameters only when the layout's cu_seqlens differ from the last call's; the previous model is
// freed first, so two never hold the device's memory at once.
class ForwardModelCuda {
 public:
  ForwardModelCuda() = default;  // serves nothing until the three-argument at()
  ForwardModelCuda(const ModelConfig& cfg, const ModelParams<float>& params);

  ModelCuda& at(const SeqLayout& layout);
  // The evaluators' entry (logit_rows_cuda.h, token_losses_cuda.h), which learn the model from
  // their first call: serves `cfg` and `params` from now on, starting over when `&params` or a
  // field of the config differs from the ones served so far, then at(layout).
  ModelCuda& at(const ModelConfig& cfg, const ModelParams<float>& params, const SeqLayout& layout);

 private:
  ModelConfig cfg_;
  std::map<std::string, std::string> cfg_fields_;  // model_config_fields(cfg_), to compare with
  const ModelParams<float>* params_ = nullptr;
  std::vector<int64_t> cu_seqlens_;  // the layout model_ was built for
  std::unique_ptr<ModelCuda> model_;
};

}  // namespace nsa::cuda
