// The kept GPU model of the evaluations (see forward_model_cuda.h).
#include "forward_model_cuda.h"

#include "nsa/error.h"

namespace nsa::cuda {

ForwardModelCuda::ForwardModelCuda(const ModelConfig& cfg, const ModelParams<float>& params)
    : cfg_(cfg), cfg_fields_(model_config_fields(cfg)), params_(&params) {}

ModelCuda& ForwardModelCuda::at(const SeqLayout& layout) {
  NSA_CHECK(params_ != nullptr, "ForwardModelCuda::at: no model to serve (no config and params)");
  if (model_ && cu_seqlens_ == layout.cu_seqlens) return *model_;
  model_.reset();  // the old buffers go before the new ones are allocated
  cu_seqlens_.clear();
  model_ = std::make_unique<ModelCuda>(cfg_, layout, Recompute::kLayers);
  ModelParams<float> copy = *params_;  // set_params reads through mutable views
  model_->set_params(copy);
  cu_seqlens_ = layout.cu_seqlens;
  return *model_;
}

ModelCuda& ForwardModelCuda::at(const ModelConfig& cfg, const ModelParams<float>& params,
                                const SeqLayout& layout) {
  std::map<std::string, std::string> fields = model_config_fields(cfg);
  if (params_ != &params || cfg_fields_ != fields) {
    model_.reset();
    cu_seqlens_.clear();
    cfg_ = cfg;
    cfg_fields_ = std::move(fields);
    params_ = &params;
  }
  return at(layout);
}

}  // namespace nsa::cuda
