// The NSA gates on the GPU (see model_ops.h and docs/nsa.md): sigmoid per branch, or softmax over
// the three branches of a head; one thread per (row, head).
#include "cuda/common/cuda_check.h"
#include "model/cuda/model_ops.h"
#include "pointwise.cuh"

namespace nsa::cuda {
namespace {

struct GatePtrs {
  bf16* gate[3];
  bool enabled[3];
};
struct GateGradPtrs {
  const float* d_gate[3];
  bool enabled[3];
};

__global__ void gate_forward_kernel(const float* __restrict__ z, const float* __restrict__ bias,
                                    bool softmax, GatePtrs out, float* __restrict__ g_raw,
                                    int64_t n /* T·H */, int64_t H) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const int64_t h = i % H;
  float v[3];
  for (int c = 0; c < 3; ++c) v[c] = z[i * 3 + c] + bias[h * 3 + c];
  gate_values(v, softmax);
  for (int c = 0; c < 3; ++c) {
    g_raw[i * 3 + c] = v[c];
    out.gate[c][i] = __float2bfloat16(out.enabled[c] ? v[c] : 0.0f);
  }
}

__global__ void gate_backward_kernel(const float* __restrict__ g_raw, GateGradPtrs in, bool softmax,
                                     float* __restrict__ dz, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float g[3], dg[3];
  for (int c = 0; c < 3; ++c) {
    g[c] = g_raw[i * 3 + c];
    dg[c] = in.enabled[c] ? in.d_gate[c][i] : 0.0f;
  }
  if (softmax) {
    const float dot = g[0] * dg[0] + g[1] * dg[1] + g[2] * dg[2];
    for (int c = 0; c < 3; ++c) dz[i * 3 + c] = g[c] * (dg[c] - dot);
  } else {
    for (int c = 0; c < 3; ++c) dz[i * 3 + c] = dg[c] * g[c] * (1.0f - g[c]);
  }
}

}  // namespace

void launch_gate_forward(const float* z, const float* bias, bool softmax, const bool enabled[3],
                         float* g_raw, bf16* const gate[3], int64_t T, int64_t H,
                         cudaStream_t stream) {
  const int64_t n = T * H;
  if (n == 0) return;
  GatePtrs out{};
  for (int c = 0; c < 3; ++c) out.gate[c] = gate[c], out.enabled[c] = enabled[c];
  gate_forward_kernel<<<static_cast<unsigned>((n + 255) / 256), 256, 0, stream>>>(z, bias, softmax,
                                                                                  out, g_raw, n, H);
  NSA_CUDA_LAUNCH_CHECK();
}

void launch_gate_backward(const float* g_raw, const float* const d_gate[3], bool softmax,
                          const bool enabled[3], float* dz, int64_t T, int64_t H,
                          cudaStream_t stream) {
  const int64_t n = T * H;
  if (n == 0) return;
  GateGradPtrs in{};
  for (int c = 0; c < 3; ++c) in.d_gate[c] = d_gate[c], in.enabled[c] = enabled[c];
  gate_backward_kernel<<<static_cast<unsigned>((n + 255) / 256), 256, 0, stream>>>(g_raw, in,
                                                                                   softmax, dz, n);
  NSA_CUDA_LAUNCH_CHECK();
}

}  // namespace nsa::cuda
