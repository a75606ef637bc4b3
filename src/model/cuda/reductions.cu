// Deterministic reductions for the model: column sums (norm weights, gate bias) and whole-buffer
// sums (loss, gradient norm). Fixed grids and fixed orders, no atomics (see model_ops.h).
#include "cuda/common/block_reduce.cuh"
#include "cuda/common/cuda_check.h"
#include "model/cuda/model_ops.h"

namespace nsa::cuda {
namespace {

constexpr int64_t kRowsPerChunk = 256;
constexpr int kSumBlocks = 1024;  // first pass of launch_sum; also the size of its partial buffer
constexpr int kThreads = 256;

int64_t chunks_of(int64_t T) {
  return (T + kRowsPerChunk - 1) / kRowsPerChunk;
}

// partial[chunk, j] = Σ rows of the chunk, in ascending row order.
__global__ void column_chunk_kernel(const float* __restrict__ in, int64_t T, int64_t D,
                                    float* __restrict__ partial) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t chunk = blockIdx.y;
  if (j >= D) return;
  const int64_t end = min(T, (chunk + 1) * kRowsPerChunk);
  float acc = 0.0f;
  for (int64_t t = chunk * kRowsPerChunk; t < end; ++t) acc += in[t * D + j];
  partial[chunk * D + j] = acc;
}

// out[j] += Σ_chunk partial[chunk, j]: one warp per column, lane l summing chunks l, l + 32, …
// in ascending order, then the warp's fixed shuffle tree. (A thread per column walking every
// chunk in turn was a chain of dependent loads: ~85 µs a call, 2 % of a training step at 2k.)
__global__ void column_finish_kernel(const float* __restrict__ partial, int64_t chunks, int64_t D,
                                     float* __restrict__ out) {
  const int64_t j = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (j >= D) return;  // whole warps: j is the warp's
  float acc = 0.0f;
  for (int64_t c = lane; c < chunks; c += 32) acc += partial[c * D + j];
  acc = warp_sum(acc);
  if (lane == 0) out[j] += acc;
}

__global__ void sum_pass1_kernel(const float* __restrict__ x, int64_t n, bool squares,
                                 float* __restrict__ partial) {
  __shared__ float scratch[33];
  float acc = 0.0f;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    acc += squares ? x[i] * x[i] : x[i];
  }
  acc = block_sum(acc, scratch);
  if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

__global__ void sum_pass2_kernel(const float* __restrict__ partial, float scale,
                                 float* __restrict__ out) {
  __shared__ float scratch[33];
  float acc = 0.0f;
  for (int i = threadIdx.x; i < kSumBlocks; i += blockDim.x) acc += partial[i];
  acc = block_sum(acc, scratch);
  if (threadIdx.x == 0) *out = acc * scale;
}

}  // namespace

int64_t column_sum_partial_floats(int64_t T, int64_t D) {
  return chunks_of(T) * D;
}

void launch_column_finish(const float* partial, int64_t chunks, int64_t D, float* out,
                          cudaStream_t stream) {
  if (chunks == 0 || D == 0) return;
  constexpr int kColumnsPerCta = kThreads / 32;
  column_finish_kernel<<<static_cast<unsigned>((D + kColumnsPerCta - 1) / kColumnsPerCta), kThreads,
                         0, stream>>>(partial, chunks, D, out);
  NSA_CUDA_LAUNCH_CHECK();
}

void launch_column_sum_accumulate(const float* in, int64_t T, int64_t D, float* partial, float* out,
                                  cudaStream_t stream) {
  if (T == 0 || D == 0) return;
  const int64_t chunks = chunks_of(T);
  const dim3 grid(static_cast<unsigned>((D + kThreads - 1) / kThreads),
                  static_cast<unsigned>(chunks));
  column_chunk_kernel<<<grid, kThreads, 0, stream>>>(in, T, D, partial);
  NSA_CUDA_LAUNCH_CHECK();
  launch_column_finish(partial, chunks, D, out, stream);
}

void launch_sum(const float* x, int64_t n, bool squares, float scale, float* partial, float* out,
                cudaStream_t stream) {
  sum_pass1_kernel<<<kSumBlocks, kThreads, 0, stream>>>(x, n, squares, partial);
  NSA_CUDA_LAUNCH_CHECK();
  sum_pass2_kernel<<<1, kThreads, 0, stream>>>(partial, scale, out);
  NSA_CUDA_LAUNCH_CHECK();
}

}  // namespace nsa::cuda
