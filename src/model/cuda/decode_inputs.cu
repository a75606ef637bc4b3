// The attention inputs of one decode step from one fused projection (see model_ops.h): a single
// GEMM gives [q | k per branch | v per branch | gate logits] per sequence, and this one kernel
// rotates q and k, converts v and applies the gates – instead of a GEMM and a kernel for each. It
// is a programmatic dependent launch on the decode step's critical path, so it takes one round
// trip to memory after its wait: the position and its rotary angles (pow and sincos in double,
// once per sequence and pair – the same call, so the same bits, as per head) come before the wait,
// the projection row lands in shared memory in one batch of copies after it. Used after a GEMM
// (prefill; decoding past the rows the few-row kernels take, kGemvFasterRows): at one row the
// decoder makes the same inputs in the product's own kernel (decode_projection.h), with this
// file's element math.
#include "cuda/common/cuda_check.h"
#include "cuda/common/dependent_launch.cuh"
#include "cuda/common/dynamic_smem.h"
#include "cuda/common/mma.cuh"
#include "model/cuda/decode_inputs.cuh"
#include "model/cuda/model_ops.h"
#include "nsa/error.h"
#include "pointwise.cuh"

namespace nsa::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxRopePairs = 256;  // dk ≤ 512
// The projection row and gate bias in shared memory, beside the angles: up to 200 KiB.
constexpr size_t kMaxRowBytes = 200 * 1024;

__global__ void __launch_bounds__(kThreads)
    decode_inputs_kernel(const float* __restrict__ proj, DecodeInputs in,
                         const int32_t* __restrict__ positions, const float* __restrict__ gate_bias,
                         double base) {
  // The next kernel may start now (common/dependent_launch.cuh, "early start"): decoding's
  // attention, whose first kernel reads only cache rows of earlier steps before its wait, or a
  // plain launch in prefill. Measured at batch 16 (this path; H200): the step 0.892 -> 0.886 ms at
  // 64k, 1.098 -> 1.090 at 128k. The few-row projection (batch 1) does not: there the parts'
  // row loads queued behind its weight loads and 64k, B = 1 lost 17 µs (docs/perf.md).
  let_next_kernel_start();
  __shared__ float cos_of[kMaxRopePairs], sin_of[kMaxRopePairs];
  // Sequence b's projection row [in.width], then the gate bias [H, 3].
  extern __shared__ __align__(16) float row[];
  float* bias = row + in.width;
  const int64_t b = blockIdx.x;
  // Positions are written two or more kernels back (the step's last kernel, or a copy before the
  // first), so they and the angles come before the wait (common/dependent_launch.cuh), as the
  // bias (a weight) does.
  if (in.gate[0] != nullptr) {
    for (int64_t i = threadIdx.x; i < 3 * in.H; i += blockDim.x)
      cp_async<4>(bias + i, gate_bias + i);
  }
  const double pos = static_cast<double>(positions[b]);
  for (int64_t i = threadIdx.x; i < in.dk / 2; i += blockDim.x)
    rope_cos_sin(pos, i, in.dk, base, false, cos_of[i], sin_of[i]);
  wait_for_previous_kernel_only();  // proj comes from the product before
  const float* from = proj + b * in.width;
  if (in.width % 4 == 0 && reinterpret_cast<uintptr_t>(from) % 16 == 0) {
    for (int64_t i = threadIdx.x; i < in.width / 4; i += blockDim.x)
      cp_async<16>(row + 4 * i, from + 4 * i);
  } else {
    for (int64_t i = threadIdx.x; i < in.width; i += blockDim.x) cp_async<4>(row + i, from + i);
  }
  cp_async_commit();
  cp_async_wait<0>();
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
      store_rotated_pair(src[off], src[off + 1], cos_of[i], sin_of[i], dst + off);
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
    for (int c = 0; c < 3; ++c) v[c] = row[in.gate_offset + h * 3 + c] + bias[h * 3 + c];
    store_head_gates(v, in, b, h);
  }
}

}  // namespace

void launch_decode_inputs(const float* proj, const DecodeInputs& in, const int32_t* positions,
                          const float* gate_bias, double rope_base, int64_t B,
                          cudaStream_t stream) {
  NSA_CHECK(in.dk / 2 <= kMaxRopePairs, "decode inputs: dk = ", in.dk, " above ",
            2 * kMaxRopePairs);
  const size_t smem = static_cast<size_t>(in.width + 3 * in.H) * sizeof(float);
  NSA_CHECK(smem <= kMaxRowBytes, "decode inputs: a projection row of ", in.width, " floats and ",
            3 * in.H, " gate biases are above the ", kMaxRowBytes / sizeof(float),
            " floats a CTA's shared memory holds here");
  if (B == 0) return;
  allow_dynamic_smem(decode_inputs_kernel, smem);
  launch_dependent(decode_inputs_kernel, dim3(static_cast<unsigned>(B)), dim3(kThreads), smem,
                   stream, proj, in, positions, gate_bias, rope_base);
}

DecodeInputs decode_inputs_layout(int64_t H, int64_t G, int64_t dk, int64_t dv, const bool kv[3],
                                  bool gates, bool softmax) {
  const auto round_up = [](int64_t x, int64_t m) { return (x + m - 1) / m * m; };
  DecodeInputs in{};
  in.H = H, in.G = G, in.dk = dk, in.dv = dv, in.softmax = softmax;
  int64_t width = H * dk;
  for (int c = 0; c < 3; ++c) {
    if (kv[c]) width = round_up(width, 2);
    in.k_offset[c] = kv[c] ? width : -1;
    width += kv[c] ? G * dk : 0;
  }
  for (int c = 0; c < 3; ++c) {
    in.v_offset[c] = kv[c] ? width : -1;
    width += kv[c] ? G * dv : 0;
  }
  if (gates) width = round_up(width, 3);
  in.gate_offset = gates ? width : -1;
  in.width = width + (gates ? 3 * H : 0);
  for (int c = 0; c < 3; ++c) in.enabled[c] = true;
  return in;
}

}  // namespace nsa::cuda
