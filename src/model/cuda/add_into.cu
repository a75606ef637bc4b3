// dst += src on the GPU (see model_ops.h): the φ = mlp parameter gradients, which the attention
// layer overwrites every backward, added into the model's gradient accumulators.
#include "cuda/common/cuda_check.h"
#include "model/cuda/model_ops.h"

namespace nsa::cuda {
namespace {

__global__ void add_into_kernel(const float* __restrict__ src, float* __restrict__ dst, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) dst[i] += src[i];
}

}  // namespace

void launch_add_into(const float* src, float* dst, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  add_into_kernel<<<static_cast<unsigned>((n + 255) / 256), 256, 0, stream>>>(src, dst, n);
  NSA_CUDA_LAUNCH_CHECK();
}

}  // namespace nsa::cuda
