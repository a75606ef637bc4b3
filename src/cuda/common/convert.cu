// Element-wise fp32 → bf16 conversion (see convert.h).
#include "common/convert.h"
#include "common/cuda_check.h"

namespace nsa::cuda {
namespace {

__global__ void f32_to_bf16_kernel(const float* __restrict__ src, __nv_bfloat16* __restrict__ dst,
                                   int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) dst[i] = __float2bfloat16(src[i]);
}

}  // namespace

void launch_f32_to_bf16(const float* src, __nv_bfloat16* dst, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  f32_to_bf16_kernel<<<static_cast<unsigned>((n + 255) / 256), 256, 0, stream>>>(src, dst, n);
  NSA_CUDA_LAUNCH_CHECK();
}

}  // namespace nsa::cuda
