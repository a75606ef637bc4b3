// Fused softmax cross-entropy on the GPU, one CTA per row (see model_ops.h): the loss of the row
// and, for training, the gradient of the logits in bf16 (the LM-head GEMMs' operand).
#include "cuda/common/block_reduce.cuh"
#include "cuda/common/cuda_check.h"
#include "model/cuda/model_ops.h"

namespace nsa::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void cross_entropy_kernel(const float* __restrict__ logits,
                                     const int32_t* __restrict__ targets, int64_t V,
                                     float grad_scale, float* __restrict__ row_loss,
                                     bf16* __restrict__ dlogits) {
  __shared__ float scratch[33];
  const int64_t t = blockIdx.x;
  const float* z = logits + t * V;
  float m = -INFINITY;
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) m = fmaxf(m, z[v]);
  m = block_max(m, scratch);
  float sum = 0.0f;
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) sum += expf(z[v] - m);
  sum = block_sum(sum, scratch);
  const float lse = m + logf(sum);
  const int32_t target = targets[t];
  if (threadIdx.x == 0) row_loss[t] = lse - z[target];
  if (!dlogits) return;
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) {
    const float p = expf(z[v] - lse);
    dlogits[t * V + v] = __float2bfloat16((p - (v == target ? 1.0f : 0.0f)) * grad_scale);
  }
}

}  // namespace

void launch_cross_entropy(const float* logits, const int32_t* targets, int64_t T, int64_t V,
                          float grad_scale, float* row_loss, bf16* dlogits, cudaStream_t stream) {
  if (T == 0) return;
  cross_entropy_kernel<<<static_cast<unsigned>(T), kThreads, 0, stream>>>(
      logits, targets, V, grad_scale, row_loss, dlogits);
  NSA_CUDA_LAUNCH_CHECK();
}

}  // namespace nsa::cuda
