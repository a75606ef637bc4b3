// Host memory accounting for the CPU path.
//
// Every tensor and workspace of the CPU reference allocates through TrackedAllocator, so the
// benchmark can report the peak number of bytes the attention really held (inputs, outputs and
// scratch) and show that it grows linearly in S. Counters are process-wide and thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <new>

namespace nsa {

struct HostMemoryStats {
  int64_t current_bytes;
  int64_t peak_bytes;
};

HostMemoryStats host_memory_stats();
// Sets the peak to the current value, so the next peak measures one phase.
void reset_host_peak();
void note_host_alloc(int64_t bytes);
void note_host_free(int64_t bytes);

template <typename T>
struct TrackedAllocator {
  using value_type = T;
  TrackedAllocator() = default;
  template <typename U>
  TrackedAllocator(const TrackedAllocator<U>&) {}
  T* allocate(std::size_t n) {
    note_host_alloc(static_cast<int64_t>(n * sizeof(T)));
    return static_cast<T*>(::operator new(n * sizeof(T)));
  }
  void deallocate(T* p, std::size_t n) {
    note_host_free(static_cast<int64_t>(n * sizeof(T)));
    ::operator delete(p);
  }
  template <typename U>
  bool operator==(const TrackedAllocator<U>&) const {
    return true;
  }
  template <typename U>
  bool operator!=(const TrackedAllocator<U>&) const {
    return false;
  }
};

}  // namespace nsa
