// Compression φ = avg on the GPU: forward (mean of l raw rows per compressed token) and backward
// (each raw row gathers d/l from the compressed tokens that cover it, in ascending order – no
// atomics). fp32 math on bf16 raw inputs; compressed K/V and all gradients in fp32.
#include <algorithm>

#include "common/cuda_check.h"
#include "nsa_kernels.h"

namespace nsa::cuda {
namespace {

constexpr int kThreads = 256;

// The keys' (blockIdx.y = 0) and the values' (1) halves of one launch: one launch for both.
struct KvPair {
  const bf16* raw[2];
  float* cmp[2];
  int64_t D[2];
};

// out [C, G, D] = mean over r < l of raw[(cmp_raw_start[i] + r), g, :].
__global__ void compress_avg_forward_kernel(const KvPair kv, const int64_t* __restrict__ raw_start,
                                            int64_t C, int64_t G, int64_t l) {
  const int64_t D = kv.D[blockIdx.y];
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= C * G * D) return;
  float* out = kv.cmp[blockIdx.y];
  const int64_t i = idx / (G * D), gc = idx % (G * D);
  if (raw_start[i] < 0) {  // a padding row of a capacity-sized compressed buffer (device_layout.h)
    out[idx] = 0.0f;
    return;
  }
  const bf16* x = kv.raw[blockIdx.y] + raw_start[i] * G * D + gc;
  float acc = 0.0f;
  for (int64_t r = 0; r < l; ++r) acc += __bfloat162float(x[r * G * D]);
  out[idx] = acc / static_cast<float>(l);
}

// d_raw [T, G, D] (=, or += when accumulate) from d_cmp [C, G, D]; keys and values by blockIdx.y.
// The last writer of the raw gradient: where the caller wants it in bf16 (p.d_k_bf16[0]) the sum
// goes there, rounded, and d_raw is only read.
__global__ void compress_avg_backward_kernel(const NsaParams p, bool accumulate) {
  const bool keys = blockIdx.y == 0;
  const int64_t D = keys ? p.dk : p.dv;
  const float* __restrict__ d_cmp = keys ? p.d_k_cmp : p.d_v_cmp;
  float* __restrict__ d_raw = keys ? p.d_k[0] : p.d_v[0];
  bf16* __restrict__ d_raw16 = keys ? p.d_k_bf16[0] : p.d_v_bf16[0];
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t G = p.G;
  if (idx >= p.T * G * D) return;
  const int64_t row = idx / (G * D), gc = idx % (G * D);
  const int64_t n = p.seq_of_row[row], t = row - p.cu_seqlens[n];
  const int64_t nc = p.cmp_offsets[n + 1] - p.cmp_offsets[n];
  const int64_t first = t - p.l + 1 > 0 ? (t - p.l + 1 + p.d - 1) / p.d : 0;
  const int64_t last = t / p.d < nc - 1 ? t / p.d : nc - 1;
  float acc = 0.0f;
  for (int64_t i = first; i <= last; ++i) acc += d_cmp[(p.cmp_offsets[n] + i) * G * D + gc];
  acc /= static_cast<float>(p.l);
  const float v = accumulate ? d_raw[idx] + acc : acc;
  if (d_raw16) {
    d_raw16[idx] = __float2bfloat16(v);
  } else {
    d_raw[idx] = v;
  }
}

unsigned blocks_for(int64_t n) {
  return static_cast<unsigned>((n + kThreads - 1) / kThreads);
}

}  // namespace

void launch_compress_avg_forward(const NsaParams& p, cudaStream_t stream) {
  if (p.C == 0) return;
  const KvPair kv{{p.k[0], p.v[0]}, {p.k_cmp, p.v_cmp}, {p.dk, p.dv}};
  const dim3 grid(blocks_for(p.C * p.G * std::max(p.dk, p.dv)), 2);
  compress_avg_forward_kernel<<<grid, kThreads, 0, stream>>>(kv, p.cmp_raw_start, p.C, p.G, p.l);
  NSA_CUDA_LAUNCH_CHECK();
}

void launch_compress_avg_backward(const NsaParams& p, bool accumulate, cudaStream_t stream) {
  if (p.T == 0) return;
  const dim3 grid(blocks_for(p.T * p.G * std::max(p.dk, p.dv)), 2);
  compress_avg_backward_kernel<<<grid, kThreads, 0, stream>>>(p, accumulate);
  NSA_CUDA_LAUNCH_CHECK();
}

}  // namespace nsa::cuda
