// FastDiv (src/cuda/common/fast_div.h), the decode kernels' division by a config's sizes, against
// the `/` and `%` it replaces: every divisor up to 4,096 on every numerator of its first three
// quotient steps, around the steps of quotients 1,000, 65,535 and the largest below 2^31, and at
// 2^31 − 1; large divisors on random numerators up to 2^31 − 1.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>

#include "../../src/cuda/common/fast_div.h"

namespace nsa {
namespace {

void expect_divides(int d, int n) {
  const FastDiv f(d);
  ASSERT_EQ(f.div(n), n / d) << n << " / " << d;
  ASSERT_EQ(f.mod(n), n % d) << n << " % " << d;
}

TEST(FastDiv, EveryDivisorUpTo4096OnTheQuotientEdges) {
  for (int d = 1; d <= 4096; ++d) {
    for (int n = 0; n < 3 * d + 2; ++n) expect_divides(d, n);
    for (int64_t q : {int64_t{1000}, int64_t{65535}, (int64_t{1} << 31) / d - 1}) {
      for (int64_t n = q * d - 1; n <= q * d + 1; ++n) {
        if (n >= 0 && n < (int64_t{1} << 31)) expect_divides(d, static_cast<int>(n));
      }
    }
    expect_divides(d, 2147483647);
  }
}

TEST(FastDiv, LargeDivisorsOnRandomNumerators) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> num(0, 2147483647), div(1, 1 << 30);
  for (int i = 0; i < 200000; ++i) expect_divides(div(rng), num(rng));
  for (int d : {1 << 20, (1 << 30) + 1, 2147483647}) {
    for (int n : {0, 1, d - 1, d, 2147483647}) expect_divides(d, n);
  }
}

TEST(FastDiv, NonPositiveDivisorIsOne) {
  EXPECT_EQ(FastDiv(0).div(12345), 12345);
  EXPECT_EQ(FastDiv(-3).mod(7), 0);
}

}  // namespace
}  // namespace nsa
