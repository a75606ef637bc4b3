// Anomaly mode on the GPU (see model_ops.h): the first non-finite element of a buffer and its
// value, for the message that names the first bad tensor (docs/training.md, "Diagnostics").
// The index is a minimum (atomicMin of integers), so the answer does not depend on the order in
// which blocks run.
#include <algorithm>
#include <climits>

#include "cuda/common/cuda_check.h"
#include "model/cuda/model_ops.h"

namespace nsa::cuda {
namespace {

constexpr int kThreads = 256;
constexpr unsigned kMaxBlocks = 1024;

__device__ inline float as_float(float x) {
  return x;
}
__device__ inline float as_float(bf16 x) {
  return __bfloat162float(x);
}

template <typename T>
__global__ void first_nonfinite_kernel(const T* __restrict__ x, int64_t n,
                                       NonFiniteHit* __restrict__ hit) {
  unsigned long long first = ULLONG_MAX;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    if (!isfinite(as_float(x[i]))) {
      first = static_cast<unsigned long long>(i);
      break;  // later indices of this thread are larger
    }
  }
  for (int off = 16; off > 0; off /= 2) {
    const unsigned long long o = __shfl_down_sync(0xffffffffu, first, off);
    first = o < first ? o : first;
  }
  if ((threadIdx.x & 31) == 0 && first != ULLONG_MAX) atomicMin(&hit->index, first);
}

template <typename T>
__global__ void hit_value_kernel(const T* __restrict__ x, NonFiniteHit* __restrict__ hit) {
  if (hit->index != ULLONG_MAX) hit->value = as_float(x[hit->index]);
}

template <typename T>
void launch(const T* x, int64_t n, NonFiniteHit* hit, cudaStream_t stream) {
  NSA_CUDA_CHECK(cudaMemsetAsync(hit, 0xff, sizeof(NonFiniteHit), stream));  // index: none
  if (n == 0) return;
  const unsigned blocks =
      static_cast<unsigned>(std::min<int64_t>(kMaxBlocks, (n + kThreads - 1) / kThreads));
  first_nonfinite_kernel<<<blocks, kThreads, 0, stream>>>(x, n, hit);
  NSA_CUDA_LAUNCH_CHECK();
  hit_value_kernel<<<1, 1, 0, stream>>>(x, hit);
  NSA_CUDA_LAUNCH_CHECK();
}

}  // namespace

void launch_find_nonfinite(const float* x, int64_t n, NonFiniteHit* hit, cudaStream_t stream) {
  launch(x, n, hit, stream);
}
void launch_find_nonfinite(const bf16* x, int64_t n, NonFiniteHit* hit, cudaStream_t stream) {
  launch(x, n, hit, stream);
}

}  // namespace nsa::cuda
