// Overflow-checked sizes and the memory limit (see include/nsa/size_limits.h).
#include "nsa/size_limits.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <limits>

#include "nsa/error.h"

namespace nsa {

int64_t checked_product(std::initializer_list<int64_t> factors, const std::string& what) {
  int64_t p = 1;
  for (int64_t f : factors) {
    NSA_CHECK(f >= 0, what, ": a factor is negative (", f, ")");
    NSA_CHECK(f == 0 || p <= std::numeric_limits<int64_t>::max() / f, what,
              " overflows 64 bits: far more than any machine holds");
    p *= f;
  }
  return p;
}

int64_t memory_limit_bytes() {
  if (const char* env = std::getenv("NSA_MEMORY_LIMIT_GIB")) {
    const double gib = std::atof(env);
    if (gib > 0) return static_cast<int64_t>(gib * (1 << 30));
  }
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page <= 0) return std::numeric_limits<int64_t>::max();
  return checked_product({pages, page}, "physical memory");
}

void check_memory(int64_t bytes, const std::string& what) {
  const int64_t limit = memory_limit_bytes();
  if (bytes <= limit) return;
  char msg[96];
  std::snprintf(msg, sizeof msg, "needs %.1f GiB, limit %.1f GiB",
                static_cast<double>(bytes) / (1 << 30), static_cast<double>(limit) / (1 << 30));
  throw Error(str(what, " ", msg, " (this machine's memory; NSA_MEMORY_LIMIT_GIB overrides)"));
}

}  // namespace nsa
