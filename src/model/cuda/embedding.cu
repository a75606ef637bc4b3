// Token embedding forward (a row gather) and its deterministic backward (see model_ops.h).
#include "cuda/common/cuda_check.h"
#include "cuda/common/dependent_launch.cuh"
#include "model/cuda/model_ops.h"

namespace nsa::cuda {
namespace {

__global__ void embedding_forward_kernel(const int32_t* __restrict__ tokens,
                                         const float* __restrict__ table, float* __restrict__ x,
                                         int64_t D) {
  let_next_kernel_start();  // the decoder's next kernel prefetches its weights meanwhile
  const int64_t t = blockIdx.x;
  const float* src = table + static_cast<int64_t>(tokens[t]) * D;
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) x[t * D + j] = src[j];
}

// One CTA per distinct token: its rows summed in ascending order, then added to the table row.
__global__ void embedding_backward_kernel(const int32_t* __restrict__ order,
                                          const int32_t* __restrict__ seg_token,
                                          const int32_t* __restrict__ seg_start,
                                          const float* __restrict__ dx, float* __restrict__ d_table,
                                          int64_t D) {
  const int s = blockIdx.x;
  const int begin = seg_start[s], end = seg_start[s + 1];
  float* dst = d_table + static_cast<int64_t>(seg_token[s]) * D;
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
    float acc = 0.0f;
    for (int e = begin; e < end; ++e) acc += dx[static_cast<int64_t>(order[e]) * D + j];
    dst[j] += acc;
  }
}

}  // namespace

void launch_embedding_forward(const int32_t* tokens, const float* table, float* x, int64_t T,
                              int64_t D, cudaStream_t stream) {
  if (T == 0) return;
  embedding_forward_kernel<<<static_cast<unsigned>(T), 256, 0, stream>>>(tokens, table, x, D);
  NSA_CUDA_LAUNCH_CHECK();
}

void launch_embedding_backward(const int32_t* order, const int32_t* seg_token,
                               const int32_t* seg_start, int64_t n_seg, const float* dx,
                               float* d_table, int64_t D, cudaStream_t stream) {
  if (n_seg == 0) return;
  embedding_backward_kernel<<<static_cast<unsigned>(n_seg), 256, 0, stream>>>(
      order, seg_token, seg_start, dx, d_table, D);
  NSA_CUDA_LAUNCH_CHECK();
}

}  // namespace nsa::cuda
