// Rotary position embedding on the GPU (see model_ops.h): pairs (2i, 2i+1) of each head rotated
// by θ_i = pos·base^(−2i/D), the angle computed in double as on the CPU.
#include <algorithm>

#include "cuda/common/cuda_check.h"
#include "model/cuda/model_ops.h"
#include "pointwise.cuh"

namespace nsa::cuda {
namespace {

// One CTA per row; thread i handles channel pair i of every head.
__global__ void rope_kernel(const float* __restrict__ in, bf16* __restrict__ out,
                            const int32_t* __restrict__ positions, int64_t heads, int64_t D,
                            double base, bool inverse) {
  const int64_t t = blockIdx.x;
  const double pos = static_cast<double>(positions[t]);
  for (int64_t i = threadIdx.x; i < D / 2; i += blockDim.x) {
    float fc, fs;
    rope_cos_sin(pos, i, D, base, inverse, fc, fs);
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t off = (t * heads + h) * D + 2 * i;
      const float a = in[off], b = in[off + 1];
      out[off] = __float2bfloat16(a * fc - b * fs);
      out[off + 1] = __float2bfloat16(a * fs + b * fc);
    }
  }
}

}  // namespace

void launch_rope_to_bf16(const float* in, bf16* out, const int32_t* positions, int64_t T,
                         int64_t heads, int64_t D, double base, bool inverse, cudaStream_t stream) {
  if (T == 0) return;
  const int threads = static_cast<int>(std::min<int64_t>(128, ((D / 2 + 31) / 32) * 32));
  rope_kernel<<<static_cast<unsigned>(T), threads, 0, stream>>>(in, out, positions, heads, D, base,
                                                                inverse);
  NSA_CUDA_LAUNCH_CHECK();
}

}  // namespace nsa::cuda
