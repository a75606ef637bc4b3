// Element-wise fp32 → bf16 conversion (see convert.h). Four elements per thread – one 16-byte load,
// one 8-byte store – when src is 16-byte and dst 8-byte aligned (and, for the rows of a wider
// matrix, four elements never straddle a row), one otherwise; the same rounding (round to nearest
// even) either way, so the bits do not depend on the path.
#include <algorithm>
#include <cstdint>

#include "common/convert.h"
#include "common/cuda_check.h"
#include "nsa/error.h"

namespace nsa::cuda {
namespace {

constexpr int kThreads = 256;

// Four elements: one 16-byte load, one 8-byte store (src 16-byte, dst 8-byte aligned).
__device__ __forceinline__ void convert4(const float* src, __nv_bfloat16* dst) {
  const float4 v = *reinterpret_cast<const float4*>(src);
  uint2 raw;
  __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&raw);
  h[0] = __floats2bfloat162_rn(v.x, v.y);
  h[1] = __floats2bfloat162_rn(v.z, v.w);
  *reinterpret_cast<uint2*>(dst) = raw;
}

// Element i of src [rows, cols] goes to dst[(i / cols)·dst_ld + i % cols].
template <int kVec>
__global__ void f32_to_bf16_kernel(const float* __restrict__ src, __nv_bfloat16* __restrict__ dst,
                                   int64_t rows, int64_t cols, int64_t dst_ld) {
  const int64_t n = rows * cols;
  const int64_t i0 = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * kVec;
  const auto at = [&](int64_t i) {
    if (rows == 1) return i;
    const int64_t r = i / cols;
    return r * dst_ld + (i - r * cols);
  };
  if (kVec == 4 && i0 + 4 <= n) {
    convert4(src + i0, dst + at(i0));
    return;
  }
  for (int64_t i = i0; i < n && i < i0 + kVec; ++i) dst[at(i)] = __float2bfloat16(src[i]);
}

// Conversion blockIdx.y of the batch; four elements per thread (one element each where the
// pointers are not aligned for the vector path), a scalar tail.
__global__ void f32_to_bf16_batch_kernel(const F32ToBf16Batch b) {
  const int j = blockIdx.y;
  const float* src = b.src[j];
  __nv_bfloat16* dst = b.dst[j];
  const int64_t n = b.count[j];
  const bool vec =
      reinterpret_cast<uintptr_t>(src) % 16 == 0 && reinterpret_cast<uintptr_t>(dst) % 8 == 0;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x * 4;
  for (int64_t i = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * 4; i < n;
       i += stride) {
    if (vec && i + 4 <= n) {
      convert4(src + i, dst + i);
    } else {  // this thread's four elements only (up to n)
      for (int64_t k = i; k < n && k < i + 4; ++k) dst[k] = __float2bfloat16(src[k]);
    }
  }
}

}  // namespace

void F32ToBf16Batch::add(const float* s, __nv_bfloat16* d, int64_t elements) {
  if (!s || !d || elements == 0) return;
  NSA_CHECK(n < kMax, "F32ToBf16Batch: more than ", kMax, " conversions");
  src[n] = s, dst[n] = d, count[n] = elements;
  ++n;
}

void launch_f32_to_bf16_batch(const F32ToBf16Batch& b, cudaStream_t stream) {
  if (b.n == 0) return;
  const int64_t most = *std::max_element(b.count, b.count + b.n);
  const int64_t blocks = std::min<int64_t>((most + 4 * kThreads - 1) / (4 * kThreads), 1024);
  f32_to_bf16_batch_kernel<<<dim3(static_cast<unsigned>(blocks), static_cast<unsigned>(b.n)),
                             kThreads, 0, stream>>>(b);
  NSA_CUDA_LAUNCH_CHECK();
}

void launch_f32_to_bf16_rows(const float* src, int64_t rows, int64_t cols, __nv_bfloat16* dst,
                             int64_t dst_ld, cudaStream_t stream) {
  const int64_t n = rows * cols;
  if (n == 0) return;
  const bool vec = reinterpret_cast<uintptr_t>(src) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(dst) % 8 == 0 &&
                   (rows == 1 || (cols % 4 == 0 && dst_ld % 4 == 0));
  const int64_t per_block = static_cast<int64_t>(kThreads) * (vec ? 4 : 1);
  const unsigned blocks = static_cast<unsigned>((n + per_block - 1) / per_block);
  if (vec) {
    f32_to_bf16_kernel<4><<<blocks, kThreads, 0, stream>>>(src, dst, rows, cols, dst_ld);
  } else {
    f32_to_bf16_kernel<1><<<blocks, kThreads, 0, stream>>>(src, dst, rows, cols, dst_ld);
  }
  NSA_CUDA_LAUNCH_CHECK();
}

void launch_f32_to_bf16(const float* src, __nv_bfloat16* dst, int64_t n, cudaStream_t stream) {
  launch_f32_to_bf16_rows(src, 1, n, dst, n, stream);
}

}  // namespace nsa::cuda
