// RMSNorm forward and backward on the GPU (see model_ops.h). Forward: one warp per row, eight
// rows per CTA; lane l owns the column quads q = l, l + 32, … (columns 4q … 4q + 3), so the sum of
// squares has one order – the lane's columns ascending, then the warp's fixed shuffle tree.
// Backward: a CTA of 128 threads per 64 rows, the rows one after the other, each by the whole CTA
// (its dot product: thread i sums columns i, i + 128, …, then the block's fixed tree); thread i
// owns the quads i, i + 128, … for the element-wise pass and sums the weight gradient's term dy∘x̂
// of its columns over the CTA's rows (rows ascending), so no T × D buffer of it is written and
// read back.
// Both take 128-bit fp32 loads and 64-bit bf16 stores when D % 4 == 0 and the pointers are
// aligned, scalars otherwise, through the same inline math – its products and sums rounded one
// at a time (__fmul_rn, __fadd_rn: never contracted into FMAs, which the compiler may place
// differently in the two paths) – so both give the same bits. (One CTA per row and that buffer:
// 9.6 ms of a 2k training step on an H100, plus 6.4 ms of column sums shared with the gate biases;
// this version 9.7 ms, the column sums under 1.4.)
#include "cuda/common/block_reduce.cuh"
#include "cuda/common/cuda_check.h"
#include "cuda/common/dynamic_smem.h"
#include "model/cuda/model_ops.h"
#include "model/cuda/pointwise.cuh"
#include "model/cuda/vec_access.cuh"

namespace nsa::cuda {
namespace {

constexpr int kWarps = 8;
constexpr int kThreads = 32 * kWarps;
constexpr int kBwdThreads = 128;            // backward: 16 CTAs (rows in flight) per SM
constexpr int kRowsPerCta = 64;             // backward: one weight-gradient partial per 64 rows
constexpr size_t kSmemAccMax = 200 * 1024;  // above: the column sums live in `partial`

// g = r·(dy·w − x̂·dot), x̂ = x·r; dyx = dy·x̂ (the weight gradient's term); each operation rounded.
__device__ inline void rms_grad(float x, float dy, float w, float r, float dot, float& g,
                                float& dyx) {
  const float xhat = __fmul_rn(x, r);
  g = __fmul_rn(r, __fsub_rn(__fmul_rn(dy, w), __fmul_rn(xhat, dot)));
  dyx = __fmul_rn(dy, xhat);
}

// Columns 4q … 4q + 3 of a row: one 16-byte access (kVec) or four scalars, zeros past D.
template <bool kVec>
__device__ inline void load_quad(const float* row, int64_t q, int64_t D, float v[4]) {
  if constexpr (kVec) {
    const float4 a = *reinterpret_cast<const float4*>(row + 4 * q);
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w;
  } else {
    for (int k = 0; k < 4; ++k) v[k] = 4 * q + k < D ? row[4 * q + k] : 0.0f;
  }
}
template <bool kVec>
__device__ inline void store_quad(float* row, int64_t q, int64_t D, const float v[4]) {
  if constexpr (kVec) {
    *reinterpret_cast<float4*>(row + 4 * q) = make_float4(v[0], v[1], v[2], v[3]);
  } else {
    for (int k = 0; k < 4; ++k) {
      if (4 * q + k < D) row[4 * q + k] = v[k];
    }
  }
}
template <bool kVec>
__device__ inline void store_quad_bf16(bf16* row, int64_t q, int64_t D, const float v[4]) {
  if constexpr (kVec) {
    store_bf16x4(row + 4 * q, v[0], v[1], v[2], v[3]);
  } else {
    for (int k = 0; k < 4; ++k) {
      if (4 * q + k < D) row[4 * q + k] = __float2bfloat16(v[k]);
    }
  }
}

template <bool kVec>
__global__ void __launch_bounds__(kThreads)
    rmsnorm_forward_kernel(const float* __restrict__ x, const float* __restrict__ w, float eps,
                           bf16* __restrict__ y, float* __restrict__ rstd, int64_t T, int64_t D) {
  const int lane = threadIdx.x & 31;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (t >= T) return;
  const int64_t quads = (D + 3) / 4;
  const float* xr = x + t * D;
  const float r =
      warp_rms_rstd(D, eps, lane, [&](int64_t q, float v[4]) { load_quad<kVec>(xr, q, D, v); });
  if (lane == 0) rstd[t] = r;
  for (int64_t q = lane; q < quads; q += 32) {
    float v[4], wv[4];
    load_quad<kVec>(xr, q, D, v);
    load_quad<kVec>(w, q, D, wv);
    for (int k = 0; k < 4; ++k) v[k] = rms_normed(v[k], r, wv[k]);
    store_quad_bf16<kVec>(y + t * D, q, D, v);
  }
}

// dx (+)= g and, when asked, its bf16 copy; col_part[blockIdx.x, j] = Σ over the CTA's rows of
// dy·x̂. The running column sums: D floats per CTA, in shared memory (acc_in_smem; copied to
// col_part at the end), else in the CTA's row of col_part itself.
template <bool kVec>
__global__ void __launch_bounds__(kBwdThreads)
    rmsnorm_backward_kernel(const float* __restrict__ x, const float* __restrict__ w,
                            const float* __restrict__ rstd, const float* __restrict__ dy,
                            float* __restrict__ dx, bool accumulate, bf16* __restrict__ dx_bf16,
                            float* __restrict__ col_part, bool acc_in_smem, int64_t T, int64_t D) {
  extern __shared__ float acc_shared[];
  __shared__ float scratch[33];
  float* acc = acc_in_smem ? acc_shared : col_part + static_cast<int64_t>(blockIdx.x) * D;
  const int64_t quads = (D + 3) / 4;
  for (int64_t q = threadIdx.x; q < quads; q += kBwdThreads) {  // thread-owned: no barrier needed
    const float zero[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    store_quad<kVec>(acc, q, D, zero);
  }
  const int64_t t0 = static_cast<int64_t>(blockIdx.x) * kRowsPerCta;
  for (int64_t t = t0; t < t0 + kRowsPerCta && t < T; ++t) {
    const float r = rstd[t];
    const float *xr = x + t * D, *dyr = dy + t * D;
    float dot = 0.0f;
    for (int64_t j = threadIdx.x; j < D; j += kBwdThreads) {
      dot = __fadd_rn(dot, __fmul_rn(__fmul_rn(__fmul_rn(dyr[j], w[j]), xr[j]), r));
    }
    dot = __fdiv_rn(block_sum(dot, scratch), static_cast<float>(D));
    for (int64_t q = threadIdx.x; q < quads; q += kBwdThreads) {
      float xv[4], dv[4], wv[4], g[4], dyx[4], old[4], a[4];
      load_quad<kVec>(xr, q, D, xv);
      load_quad<kVec>(dyr, q, D, dv);
      load_quad<kVec>(w, q, D, wv);
      for (int k = 0; k < 4; ++k) rms_grad(xv[k], dv[k], wv[k], r, dot, g[k], dyx[k]);
      if (accumulate) {
        load_quad<kVec>(dx + t * D, q, D, old);
        for (int k = 0; k < 4; ++k) g[k] = __fadd_rn(old[k], g[k]);
      }
      store_quad<kVec>(dx + t * D, q, D, g);
      if (dx_bf16) store_quad_bf16<kVec>(dx_bf16 + t * D, q, D, g);
      load_quad<kVec>(acc, q, D, a);
      for (int k = 0; k < 4; ++k) a[k] = __fadd_rn(a[k], dyx[k]);
      store_quad<kVec>(acc, q, D, a);
    }
  }
  if (!acc_in_smem) return;  // each thread wrote its own columns of col_part already
  __syncthreads();
  for (int64_t j = threadIdx.x; j < D; j += kBwdThreads) {
    col_part[static_cast<int64_t>(blockIdx.x) * D + j] = acc[j];
  }
}

unsigned ctas(int64_t n, int64_t per) {
  return static_cast<unsigned>((n + per - 1) / per);
}

}  // namespace

void launch_rmsnorm_forward(const float* x, const float* w, float eps, bf16* y, float* rstd,
                            int64_t T, int64_t D, cudaStream_t stream) {
  if (T == 0) return;
  if (D % 4 == 0 && aligned_for(16, x, w) && aligned_for(8, y)) {
    rmsnorm_forward_kernel<true>
        <<<ctas(T, kWarps), kThreads, 0, stream>>>(x, w, eps, y, rstd, T, D);
  } else {
    rmsnorm_forward_kernel<false>
        <<<ctas(T, kWarps), kThreads, 0, stream>>>(x, w, eps, y, rstd, T, D);
  }
  NSA_CUDA_LAUNCH_CHECK();
}

int64_t rmsnorm_backward_partial_floats(int64_t T, int64_t D) {
  return (T + kRowsPerCta - 1) / kRowsPerCta * D;
}

void launch_rmsnorm_backward(const float* x, const float* w, const float* rstd, const float* dy,
                             float* dx, bool accumulate_dx, bf16* dx_bf16, float* dw,
                             float* partial, int64_t T, int64_t D, cudaStream_t stream) {
  if (T == 0) return;
  const int64_t chunks = (T + kRowsPerCta - 1) / kRowsPerCta;
  const size_t acc_bytes = static_cast<size_t>(D) * sizeof(float);
  const bool shared = acc_bytes <= kSmemAccMax;
  float* col_part = partial;
  const size_t smem = shared ? acc_bytes : 0;
  const auto launch = [&](auto kernel) {
    allow_dynamic_smem(kernel, smem);
    kernel<<<static_cast<unsigned>(chunks), kBwdThreads, smem, stream>>>(
        x, w, rstd, dy, dx, accumulate_dx, dx_bf16, col_part, shared, T, D);
    NSA_CUDA_LAUNCH_CHECK();
  };
  if (D % 4 == 0 && aligned_for(16, x, w, dy, dx, partial) && aligned_for(8, dx_bf16)) {
    launch(rmsnorm_backward_kernel<true>);
  } else {
    launch(rmsnorm_backward_kernel<false>);
  }
  launch_column_finish(col_part, chunks, D, dw, stream);
}

}  // namespace nsa::cuda
