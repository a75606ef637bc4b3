// A bump allocator over one device allocation that someone else owns: the scratch of an NSA
// forward or backward carved into typed arrays. The same carving code runs twice – once over a
// null base to count the bytes (`Workspace::sizing()`), once over the real memory – so the size a
// caller is told and the layout used can never disagree. Nothing here allocates or synchronises:
// callers that must not touch the allocator inside a call (the C ABI under CUDA graph capture)
// hand in memory they got beforehand (e.g. a PyTorch tensor from its caching allocator).
#pragma once

#include <cstddef>
#include <cstdint>

#include "nsa/error.h"

namespace nsa::cuda {

class Workspace {
 public:
  // Every array starts on this boundary (cub and vectorised loads want at least 16 bytes).
  static constexpr size_t kAlign = 256;

  // Counts bytes only: take() returns null pointers.
  static Workspace sizing() { return Workspace(nullptr, SIZE_MAX); }
  Workspace(void* base, size_t bytes) : base_(static_cast<char*>(base)), capacity_(bytes) {
    NSA_CHECK(reinterpret_cast<uintptr_t>(base) % kAlign == 0,
              "workspace: the base address must be ", kAlign, "-byte aligned");
  }

  // n elements of T (n >= 0); throws nsa::Error when the workspace is too small.
  template <typename T>
  T* take(int64_t n) {
    NSA_CHECK(n >= 0, "workspace: negative element count ", n);
    const size_t start = (used_ + kAlign - 1) / kAlign * kAlign;
    const size_t bytes = static_cast<size_t>(n) * sizeof(T);
    NSA_CHECK(start + bytes <= capacity_, "workspace of ", capacity_, " bytes is too small (needs ",
              start + bytes, " so far); ask nsa_cuda_workspace_bytes for the size");
    used_ = start + bytes;
    return base_ && n > 0 ? reinterpret_cast<T*>(base_ + start) : nullptr;
  }
  // Untyped bytes (cub's temporary storage).
  void* take_bytes(size_t bytes) { return take<unsigned char>(static_cast<int64_t>(bytes)); }

  bool counting() const { return base_ == nullptr; }
  // Bytes taken so far, padding included: the size to allocate after a sizing pass.
  size_t used() const { return used_; }

 private:
  char* base_;
  size_t capacity_;
  size_t used_ = 0;
};

}  // namespace nsa::cuda
