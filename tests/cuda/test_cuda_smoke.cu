// The CUDA toolchain and runtime wiring: an sm_90a kernel runs and computes the right thing, and
// the error macros turn a failing runtime call into an nsa::Error naming it.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "cuda/common/cuda_check.h"

namespace {

__global__ void affine_kernel(const float* __restrict__ x, float* __restrict__ y, float a, float b,
                              int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + b;
}

TEST(CudaSmoke, KernelMatchesHost) {
  const int64_t n = 100003;  // not a multiple of the block size
  std::vector<float> x(n), y(n);
  for (int64_t i = 0; i < n; ++i) x[i] = static_cast<float>(i % 97) - 48.0f;
  float *dx = nullptr, *dy = nullptr;
  NSA_CUDA_CHECK(cudaMalloc(&dx, n * sizeof(float)));
  NSA_CUDA_CHECK(cudaMalloc(&dy, n * sizeof(float)));
  NSA_CUDA_CHECK(cudaMemcpy(dx, x.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  affine_kernel<<<(n + 255) / 256, 256>>>(dx, dy, 2.0f, 0.5f, n);
  NSA_CUDA_LAUNCH_CHECK();
  NSA_CUDA_CHECK(cudaMemcpy(y.data(), dy, n * sizeof(float), cudaMemcpyDeviceToHost));
  NSA_CUDA_CHECK(cudaFree(dx));
  NSA_CUDA_CHECK(cudaFree(dy));
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(y[i], 2.0f * x[i] + 0.5f) << i;
}

TEST(CudaSmoke, ErrorsNameTheCall) {
  void* p = nullptr;
  try {
    NSA_CUDA_CHECK(cudaMalloc(&p, size_t{1} << 62));
    FAIL() << "a 4 EiB allocation succeeded";
  } catch (const nsa::Error& e) {
    EXPECT_NE(std::string(e.what()).find("cudaMalloc"), std::string::npos) << e.what();
  }
}

}  // namespace
