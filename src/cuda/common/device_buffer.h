// An owning, typed device allocation (cudaMalloc/cudaFree), movable, never copied implicitly.
// Sizes are element counts (int64_t). Host transfers are explicit and checked.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <utility>
#include <vector>

#include "common/cuda_check.h"

namespace nsa::cuda {

template <typename T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(int64_t n) { resize(n); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept { *this = std::move(o); }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    std::swap(ptr_, o.ptr_);
    std::swap(size_, o.size_);
    return *this;
  }
  ~DeviceBuffer() {
    if (ptr_) cudaFree(ptr_);
  }

  // Reallocates (contents lost) when the size changes.
  void resize(int64_t n) {
    if (n == size_) return;
    if (ptr_) NSA_CUDA_CHECK(cudaFree(ptr_));
    ptr_ = nullptr;
    size_ = n;
    if (n > 0) NSA_CUDA_CHECK(cudaMalloc(&ptr_, static_cast<size_t>(n) * sizeof(T)));
  }
  void zero(cudaStream_t stream = nullptr) {
    if (size_ > 0) NSA_CUDA_CHECK(cudaMemsetAsync(ptr_, 0, bytes(), stream));
  }
  // Fills every byte with 0xff (NaN for float and bf16): tests use it to prove that kernels
  // write every element they own.
  void poison(cudaStream_t stream = nullptr) {
    if (size_ > 0) NSA_CUDA_CHECK(cudaMemsetAsync(ptr_, 0xff, bytes(), stream));
  }
  // Complete on return: a pageable cudaMemcpy may still be in flight on the legacy stream, which
  // kernels on non-blocking streams (the model's) would not wait for.
  void upload(const T* host, int64_t n) {
    resize(n);
    if (n > 0) {
      NSA_CUDA_CHECK(cudaMemcpy(ptr_, host, bytes(), cudaMemcpyHostToDevice));
      NSA_CUDA_CHECK(cudaStreamSynchronize(nullptr));
    }
  }
  std::vector<T> download() const {
    std::vector<T> out(static_cast<size_t>(size_));
    if (size_ > 0) NSA_CUDA_CHECK(cudaMemcpy(out.data(), ptr_, bytes(), cudaMemcpyDeviceToHost));
    return out;
  }

  T* get() { return ptr_; }
  const T* get() const { return ptr_; }
  int64_t size() const { return size_; }
  size_t bytes() const { return static_cast<size_t>(size_) * sizeof(T); }

 private:
  T* ptr_ = nullptr;
  int64_t size_ = 0;
};

}  // namespace nsa::cuda
