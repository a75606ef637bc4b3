// The selection-distance histogram of the metrics on the GPU (see model_ops.h), the rule of the
// CPU model (model/model_cpu.h, sel_distance_bucket): how far back, in selection blocks, the
// freely chosen blocks lie. Integer atomics: the counts do not depend on the order of addition.
#include <algorithm>

#include "cuda/common/cuda_check.h"
#include "model/cuda/model_ops.h"

namespace nsa::cuda {
namespace {

constexpr int kThreads = 256;
constexpr unsigned kMaxBlocks = 1024;

__global__ void sel_distance_hist_kernel(const int32_t* __restrict__ sel_idx,
                                         const int32_t* __restrict__ positions, int64_t T,
                                         int64_t per_row, int64_t l_sel,
                                         unsigned long long* __restrict__ hist) {
  __shared__ unsigned int local[kSelDistanceBuckets];
  if (threadIdx.x < kSelDistanceBuckets) local[threadIdx.x] = 0;
  __syncthreads();
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < T * per_row;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t sel = sel_idx[i];
    const int64_t dist = positions[i / per_row] / l_sel - sel;
    if (sel <= 0 || dist < 2) continue;  // padding and forced blocks (0, c−1, c)
    const int bucket = min(kSelDistanceBuckets - 1, 63 - __clzll(static_cast<long long>(dist)));
    atomicAdd(&local[bucket], 1u);
  }
  __syncthreads();
  if (threadIdx.x < kSelDistanceBuckets && local[threadIdx.x] > 0) {
    atomicAdd(&hist[threadIdx.x], static_cast<unsigned long long>(local[threadIdx.x]));
  }
}

}  // namespace

void launch_sel_distance_hist(const int32_t* sel_idx, const int32_t* positions, int64_t T,
                              int64_t groups, int64_t n_sel, int64_t l_sel,
                              unsigned long long* hist, cudaStream_t stream) {
  const int64_t n = T * groups * n_sel;
  if (n == 0) return;
  const unsigned blocks =
      static_cast<unsigned>(std::min<int64_t>(kMaxBlocks, (n + kThreads - 1) / kThreads));
  sel_distance_hist_kernel<<<blocks, kThreads, 0, stream>>>(sel_idx, positions, T, groups * n_sel,
                                                            l_sel, hist);
  NSA_CUDA_LAUNCH_CHECK();
}

}  // namespace nsa::cuda
