// The NCCL gradient all-reduce on one GPU: the rendezvous through a host communicator, the
// communicator set-up and an in-place sum on a stream (one rank: the sum is the input, bit for
// bit). Two GPUs are needed for more; the 2-GPU device kind runs the data-parallel trainer.
#include <gtest/gtest.h>

#include <vector>

#include "cuda/common/cuda_check.h"
#include "cuda/common/device_buffer.h"
#include "dist/communicator.h"
#ifdef NSA_HAVE_NCCL
#include "dist/nccl/nccl_reducer.h"
#endif

namespace nsa::cuda {
namespace {

#ifdef NSA_HAVE_NCCL
TEST(NcclReducer, OneRankSumLeavesTheBufferUnchanged) {
  const std::unique_ptr<Communicator> host = make_local_communicator();
  NcclReducer reducer(*host);
  std::vector<float> x(100003);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 977) * 0.37f - 11.0f;
  DeviceBuffer<float> d;
  d.resize(static_cast<int64_t>(x.size()));
  cudaStream_t stream = nullptr;
  NSA_CUDA_CHECK(cudaStreamCreate(&stream));
  NSA_CUDA_CHECK(cudaMemcpy(d.get(), x.data(), d.bytes(), cudaMemcpyHostToDevice));
  reducer.allreduce_sum(d.get(), d.size(), stream);
  reducer.allreduce_sum(d.get(), d.size(), stream);
  std::vector<float> y(x.size());
  NSA_CUDA_CHECK(cudaMemcpyAsync(y.data(), d.get(), d.bytes(), cudaMemcpyDeviceToHost, stream));
  NSA_CUDA_CHECK(cudaStreamSynchronize(stream));
  NSA_CUDA_CHECK(cudaStreamDestroy(stream));
  EXPECT_EQ(x, y);
}
#endif

}  // namespace
}  // namespace nsa::cuda
