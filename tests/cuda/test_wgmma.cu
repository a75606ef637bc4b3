// The warpgroup MMA building blocks (src/cuda/common/wgmma.cuh) against a CPU product: a 64 × 64
// × 64 bf16 product with both operands in 128-byte-swizzled shared memory (B K-major and
// MN-major), and with A in registers (B K-major and MN-major). A wrong swizzle, descriptor field or
// fragment layout moves most entries of the result, so each check compares every entry.
#include <gtest/gtest.h>

#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "cuda/common/cuda_check.h"
#include "cuda/common/mma.cuh"
#include "cuda/common/wgmma.cuh"

namespace nsa::cuda {
namespace {

constexpr int kN = 64;  // M = N = K = 64

enum class Mode { kSS, kRS, kSSTransB, kRSTransB };

template <Mode M>
__global__ void __launch_bounds__(128)
    product_kernel(const __nv_bfloat16* a_g, const __nv_bfloat16* b_g, float* d_g) {
  extern __shared__ unsigned char smem_raw[];
  const uint32_t base = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
  unsigned char* sa = smem_raw + (((base + 1023u) & ~1023u) - base);  // 1024-byte aligned
  unsigned char* sb = sa + kN * 128;
  for (int i = threadIdx.x; i < kN * kN; i += blockDim.x) {
    const uint32_t r = i / kN, c = i % kN;
    *reinterpret_cast<__nv_bfloat16*>(sa + sw128_offset(r, c)) = a_g[i];
    *reinterpret_cast<__nv_bfloat16*>(sb + sw128_offset(r, c)) = b_g[i];
  }
  fence_proxy_async_smem();
  __syncthreads();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  float d[32];
#pragma unroll
  for (int i = 0; i < 32; ++i) d[i] = 0.0f;
  wgmma_fence();
#pragma unroll
  for (int k = 0; k < kN / 16; ++k) {
    if constexpr (M == Mode::kSS) {
      wgmma_m64n64k16_ss(d, kmajor_desc(sa, k), kmajor_desc(sb, k), k > 0);
    } else if constexpr (M == Mode::kSSTransB) {
      wgmma_m64n64k16_ss<true>(d, kmajor_desc(sa, k), mnmajor_desc(sb, k), k > 0);
    } else {
      const int r0 = 16 * warp + g, c0 = 16 * k + 2 * t;
      const uint32_t a[4] = {ld_u32(a_g + r0 * kN + c0), ld_u32(a_g + (r0 + 8) * kN + c0),
                             ld_u32(a_g + r0 * kN + c0 + 8), ld_u32(a_g + (r0 + 8) * kN + c0 + 8)};
      if constexpr (M == Mode::kRS) {
        wgmma_m64n64k16_rs(d, a, kmajor_desc(sb, k), k > 0);
      } else {
        wgmma_m64n64k16_rs<true>(d, a, mnmajor_desc(sb, k), k > 0);
      }
    }
  }
  wgmma_commit();
  wgmma_wait<0>();
#pragma unroll
  for (int j = 0; j < 8; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int row = 16 * warp + g + 8 * (e >> 1), col = 8 * j + 2 * t + (e & 1);
      d_g[row * kN + col] = d[4 * j + e];
    }
  }
}

// Runs the product of mode M on a (row-major M × K) and b (N × K for K-major B, K × N for
// MN-major); returns the largest |GPU − CPU| over all entries and the largest |CPU|.
template <Mode M>
std::pair<double, double> run(const std::vector<float>& a, const std::vector<float>& b) {
  std::vector<__nv_bfloat16> ah(a.size()), bh(b.size());
  for (size_t i = 0; i < a.size(); ++i) ah[i] = __float2bfloat16(a[i]);
  for (size_t i = 0; i < b.size(); ++i) bh[i] = __float2bfloat16(b[i]);
  __nv_bfloat16 *ad = nullptr, *bd = nullptr;
  float* dd = nullptr;
  NSA_CUDA_CHECK(cudaMalloc(&ad, ah.size() * sizeof(ah[0])));
  NSA_CUDA_CHECK(cudaMalloc(&bd, bh.size() * sizeof(bh[0])));
  NSA_CUDA_CHECK(cudaMalloc(&dd, kN * kN * sizeof(float)));
  NSA_CUDA_CHECK(cudaMemcpy(ad, ah.data(), ah.size() * sizeof(ah[0]), cudaMemcpyHostToDevice));
  NSA_CUDA_CHECK(cudaMemcpy(bd, bh.data(), bh.size() * sizeof(bh[0]), cudaMemcpyHostToDevice));
  const size_t smem = 2 * kN * 128 + 1024;
  product_kernel<M><<<1, 128, smem>>>(ad, bd, dd);
  NSA_CUDA_LAUNCH_CHECK();
  std::vector<float> d(kN * kN);
  NSA_CUDA_CHECK(cudaMemcpy(d.data(), dd, d.size() * sizeof(float), cudaMemcpyDeviceToHost));
  cudaFree(ad), cudaFree(bd), cudaFree(dd);
  double err = 0.0, mag = 0.0;
  for (int m = 0; m < kN; ++m) {
    for (int n = 0; n < kN; ++n) {
      double ref = 0.0;
      for (int k = 0; k < kN; ++k) {
        const double bv = M == Mode::kSSTransB || M == Mode::kRSTransB
                              ? __bfloat162float(bh[k * kN + n])
                              : __bfloat162float(bh[n * kN + k]);
        ref += static_cast<double>(__bfloat162float(ah[m * kN + k])) * bv;
      }
      err = std::max(err, std::abs(ref - d[m * kN + n]));
      mag = std::max(mag, std::abs(ref));
    }
  }
  return {err, mag};
}

std::vector<float> random_matrix(uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> x(kN * kN);
  for (float& v : x) v = u(rng);
  return x;
}

// fp32 accumulation of 64 products of bf16 values below 1: a few ulp of the result.
constexpr double kTol = 1e-4;

TEST(CudaWgmma, SharedOperandsKMajor) {
  const auto [err, mag] = run<Mode::kSS>(random_matrix(1), random_matrix(2));
  EXPECT_GT(mag, 1.0);
  EXPECT_LT(err, kTol) << "max |ref| " << mag;
}

TEST(CudaWgmma, RegisterAKMajorB) {
  const auto [err, mag] = run<Mode::kRS>(random_matrix(3), random_matrix(4));
  EXPECT_GT(mag, 1.0);
  EXPECT_LT(err, kTol) << "max |ref| " << mag;
}

TEST(CudaWgmma, SharedOperandsMNMajorB) {
  const auto [err, mag] = run<Mode::kSSTransB>(random_matrix(5), random_matrix(6));
  EXPECT_GT(mag, 1.0);
  EXPECT_LT(err, kTol) << "max |ref| " << mag;
}

TEST(CudaWgmma, RegisterAMNMajorB) {
  const auto [err, mag] = run<Mode::kRSTransB>(random_matrix(7), random_matrix(8));
  EXPECT_GT(mag, 1.0);
  EXPECT_LT(err, kTol) << "max |ref| " << mag;
}

}  // namespace
}  // namespace nsa::cuda
