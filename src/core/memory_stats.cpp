// Process-wide counters behind TrackedAllocator (see memory_stats.h).
#include "nsa/memory_stats.h"

#include <atomic>

namespace nsa {
namespace {
std::atomic<int64_t> g_current{0};
std::atomic<int64_t> g_peak{0};
}  // namespace

void note_host_alloc(int64_t bytes) {
  const int64_t now = g_current.fetch_add(bytes) + bytes;
  int64_t peak = g_peak.load();
  while (now > peak && !g_peak.compare_exchange_weak(peak, now)) {
  }
}

void note_host_free(int64_t bytes) {
  g_current.fetch_sub(bytes);
}

HostMemoryStats host_memory_stats() {
  return {g_current.load(), g_peak.load()};
}

void reset_host_peak() {
  g_peak.store(g_current.load());
}

}  // namespace nsa
