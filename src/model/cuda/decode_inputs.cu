// The attention inputs of one decode step from one fused projection (see model_ops.h): a single
// GEMM gives [q | k per branch | v per branch | gate logits] per sequence, and this one kernel
// rotates q and k, converts v and applies the gates – instead of a GEMM and a kernel for each. The
// rotary angles depend on the position and the pair only: each (cos, sin) is computed once per
// sequence into shared memory (the same call, so the same bits, as per head) instead of once per
// head and pair (pow and sincos in double), and the kernel is a programmatic dependent launch, so
// it is resident when the product before it ends.
#include "cuda/common/cuda_check.h"
#include "cuda/common/dependent_launch.cuh"
#include "model/cuda/model_ops.h"
#include "nsa/error.h"
#include "pointwise.cuh"

namespace nsa::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxRopePairs = 256;  // dk ≤ 512

__global__ void __launch_bounds__(kThreads)
    decode_inputs_kernel(const float* __restrict__ proj, DecodeInputs in,
                         const int32_t* __restrict__ positions, const float* __restrict__ gate_bias,
                         double base) {
  __shared__ float cos_of[kMaxRopePairs], sin_of[kMaxRopePairs];
  wait_for_previous_kernel();  // proj comes from the product before
  const int64_t b = blockIdx.x;
  const float* row = proj + b * in.width;
  const double pos = static_cast<double>(positions[b]);
  for (int64_t i = threadIdx.x; i < in.dk / 2; i += blockDim.x)
    rope_cos_sin(pos, i, in.dk, base, false, cos_of[i], sin_of[i]);
  __syncthreads();
  // Rotated q and k: channel pairs of every head.
  for (int part = 0; part < 4; ++part) {  // q, then k of branches 0..2
    const bool is_q = part == 0;
    if (!is_q && in.k[part - 1] == nullptr) continue;
    const int64_t heads = is_q ? in.H : in.G;
    const float* src = row + (is_q ? 0 : in.k_offset[part - 1]);
    bf16* dst = (is_q ? in.q : in.k[part - 1]) + b * heads * in.dk;
    for (int64_t idx = threadIdx.x; idx < heads * in.dk / 2; idx += blockDim.x) {
      const int64_t h = idx / (in.dk / 2), i = idx % (in.dk / 2), off = h * in.dk + 2 * i;
      const float fc = cos_of[i], fs = sin_of[i];
      const float x0 = src[off], x1 = src[off + 1];
      dst[off] = __float2bfloat16(x0 * fc - x1 * fs);
      dst[off + 1] = __float2bfloat16(x0 * fs + x1 * fc);
    }
  }
  for (int c = 0; c < 3; ++c) {
    if (in.v[c] == nullptr) continue;
    for (int64_t idx = threadIdx.x; idx < in.G * in.dv; idx += blockDim.x)
      in.v[c][b * in.G * in.dv + idx] = __float2bfloat16(row[in.v_offset[c] + idx]);
  }
  if (in.gate[0] == nullptr) return;
  for (int64_t h = threadIdx.x; h < in.H; h += blockDim.x) {
    float v[3];
    for (int c = 0; c < 3; ++c) v[c] = row[in.gate_offset + h * 3 + c] + gate_bias[h * 3 + c];
    gate_values(v, in.softmax);
    for (int c = 0; c < 3; ++c)
      in.gate[c][b * in.H + h] = __float2bfloat16(in.enabled[c] ? v[c] : 0.0f);
  }
}

}  // namespace

void launch_decode_inputs(const float* proj, const DecodeInputs& in, const int32_t* positions,
                          const float* gate_bias, double rope_base, int64_t B,
                          cudaStream_t stream) {
  NSA_CHECK(in.dk / 2 <= kMaxRopePairs, "decode inputs: dk = ", in.dk, " above ",
            2 * kMaxRopePairs);
  if (B == 0) return;
  launch_dependent(decode_inputs_kernel, dim3(static_cast<unsigned>(B)), dim3(kThreads), 0, stream,
                   proj, in, positions, gate_bias, rope_base);
}

}  // namespace nsa::cuda
