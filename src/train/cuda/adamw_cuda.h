// The GPU optimizer: AdamW (train/adamw.h) on a GPU model's flat weight and gradient buffers
// (model/cuda/model_params_cuda.h), with the moments on the device and, for ZeRO-1, only one
// rank's slice of them. Owned by the training layer: the model knows nothing of it.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "cuda/common/device_buffer.h"
#include "model/cuda/model_cuda.h"
#include "train/adamw.h"

namespace nsa::cuda {

class AdamWCuda {
 public:
  // Zero moments for every element of `model`'s parameters; `model` must outlive this.
  explicit AdamWCuda(ModelCuda& model);

  // AdamW on the gradients times grad_scale (1/accumulation), clipped; returns the pre-clip norm
  // of the scaled gradients. Sharded, only the weights of this rank's slice are updated.
  double step(const AdamWConfig& adam, int64_t step, double grad_scale);

  // Moments, one tensor per parameter in named order. Sharded (ZeRO-1), only this rank's slice
  // goes up, and `gather` (every rank's slice of a flat buffer of flat_size() floats, e.g.
  // Communicator::allgather_ranges) completes the moments that come down.
  using GatherFlat = std::function<void(std::vector<float>& flat)>;
  void set_state(const std::vector<Tensor<float>>& m, const std::vector<Tensor<float>>& v);
  void get_state(std::vector<Tensor<float>>& m, std::vector<Tensor<float>>& v,
                 const GatherFlat& gather = nullptr);

  // ZeRO-1: keep the moments for, and update, only the flat elements [lo, hi) of the parameter
  // buffer (the moments held so far are kept for that slice). After step() the rest of the weights
  // are stale until every rank's slice is put together: download_weight_slice, gather across
  // ranks, ModelParamsCuda::upload_weights_flat.
  int64_t flat_size() const { return params_.flat_size(); }
  void shard(int64_t lo, int64_t hi);
  void download_weight_slice(std::vector<float>& flat);  // flat [flat_size()]; fills [lo, hi)

  size_t device_bytes() const { return moment1_.bytes() + moment2_.bytes(); }

 private:
  void check_moments(const std::vector<Tensor<float>>& t) const;  // one per slot, slot-sized

  ModelCuda& model_;
  ModelParamsCuda& params_;
  cudaStream_t stream_;
  DeviceBuffer<float> moment1_, moment2_;  // AdamW m and v: [shard_hi_ − shard_lo_]
  int64_t shard_lo_ = 0, shard_hi_ = 0;    // ZeRO-1 slice, or the whole buffer
};

}  // namespace nsa::cuda
