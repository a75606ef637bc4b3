// The GPU training backend (see train/train_model.h): ModelCuda behind the training loop's
// interface, with host mirrors of the weights and AdamW moments for checkpoints.
#pragma once

#include <memory>

#include "train/train_model.h"

namespace nsa::cuda {

std::unique_ptr<TrainModel> make_train_model_cuda(const ModelConfig& cfg, const SeqLayout& layout,
                                                  const AdamWConfig& adam, Recompute recompute);

}  // namespace nsa::cuda
