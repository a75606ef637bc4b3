// Entry point of the CUDA tests: without a usable GPU, say so and exit 77, which CTest reports as
// "skipped" (SKIP_RETURN_CODE) – never a silent pass.
#include <gtest/gtest.h>

#include <cstdio>

#include "cuda/device.h"

int main(int argc, char** argv) {
  if (nsa::cuda::device_count() == 0) {
    std::printf("SKIPPED: no CUDA device available; the CUDA tests run on a GPU machine\n");
    return 77;
  }
  std::printf("CUDA device 0: %s\n", nsa::cuda::device_description(0).c_str());
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
