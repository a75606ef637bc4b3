// Division by a divisor fixed before a launch (a config's d, l_sel, w, …), for non-negative ints
// below 2^31: a multiply-high, an add and a shift instead of the ~20 instructions of a division
// by a runtime value. The decode kernels run at batch 1 as a few CTAs whose every dependent
// instruction costs its whole latency (docs/perf.md), and their index arithmetic divides by the
// config's sizes on the critical path.
//
// The round-up method: with s = ⌈log2 d⌉ and mul = ⌊2^32·(2^s − d) / d⌋ + 1, n / d =
// (mulhi(n, mul) + n) >> s for 0 ≤ n < 2^32, and the sum fits 32 bits for n < 2^31 (mulhi(n, mul)
// < n). Plain C++ on the host (no CUDA headers) so that the CPU tests check it against `/`
// (tests/cpu/test_fast_div.cpp).
#pragma once

#include <cstdint>

#ifdef __CUDACC__
#define NSA_FAST_DIV_HD __host__ __device__ __forceinline__
#else
#define NSA_FAST_DIV_HD inline
#endif

namespace nsa {

struct FastDiv {
  uint32_t mul = 1, shift = 0;
  int d = 1;

  FastDiv() = default;
  // d ≥ 1 (the caller's sizes are validated); d ≤ 0 is taken as 1.
  explicit FastDiv(int divisor) : d(divisor < 1 ? 1 : divisor) {
    while ((uint64_t{1} << shift) < static_cast<uint64_t>(d)) ++shift;
    mul = static_cast<uint32_t>(((uint64_t{1} << 32) * ((uint64_t{1} << shift) - d)) / d + 1);
  }

  // n / d for 0 ≤ n < 2^31.
  NSA_FAST_DIV_HD int div(int n) const {
    const uint32_t u = static_cast<uint32_t>(n);
#ifdef __CUDA_ARCH__
    const uint32_t hi = __umulhi(u, mul);
#else
    const uint32_t hi = static_cast<uint32_t>((static_cast<uint64_t>(u) * mul) >> 32);
#endif
    return static_cast<int>((hi + u) >> shift);
  }
  // n mod d for 0 ≤ n < 2^31.
  NSA_FAST_DIV_HD int mod(int n) const {
    return n - div(n) * d;
  }
};

}  // namespace nsa
