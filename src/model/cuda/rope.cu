// Rotary position embedding on the GPU (see model_ops.h): pairs (2i, 2i+1) of each head rotated
// by θ_i = pos·base^(−2i/D), the angle computed in double as on the CPU. A pair moves as one
// 8-byte fp32 load and one 4-byte bf16 store when the pointers allow (they do for the model's
// buffers), as two scalars otherwise; the same inline math either way.
#include <algorithm>

#include "cuda/common/cuda_check.h"
#include "model/cuda/model_ops.h"
#include "model/cuda/vec_access.cuh"
#include "pointwise.cuh"

namespace nsa::cuda {
namespace {

__device__ inline float2 rotate(float a, float b, float fc, float fs) {
  return make_float2(a * fc - b * fs, a * fs + b * fc);
}

// One CTA per row; thread i handles channel pair i of every head.
template <bool kPaired>
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
      if constexpr (kPaired) {
        const float2 ab = *reinterpret_cast<const float2*>(in + off);
        const float2 r = rotate(ab.x, ab.y, fc, fs);
        *reinterpret_cast<__nv_bfloat162*>(out + off) = __floats2bfloat162_rn(r.x, r.y);
      } else {
        const float2 r = rotate(in[off], in[off + 1], fc, fs);
        out[off] = __float2bfloat16(r.x);
        out[off + 1] = __float2bfloat16(r.y);
      }
    }
  }
}

}  // namespace

void launch_rope_to_bf16(const float* in, bf16* out, const int32_t* positions, int64_t T,
                         int64_t heads, int64_t D, double base, bool inverse, cudaStream_t stream) {
  if (T == 0) return;
  const int threads = static_cast<int>(std::min<int64_t>(128, ((D / 2 + 31) / 32) * 32));
  if (D % 2 == 0 && aligned_for(8, in) && aligned_for(4, out)) {  // every pair starts aligned
    rope_kernel<true><<<static_cast<unsigned>(T), threads, 0, stream>>>(in, out, positions, heads,
                                                                        D, base, inverse);
  } else {
    rope_kernel<false><<<static_cast<unsigned>(T), threads, 0, stream>>>(in, out, positions, heads,
                                                                         D, base, inverse);
  }
  NSA_CUDA_LAUNCH_CHECK();
}

}  // namespace nsa::cuda
