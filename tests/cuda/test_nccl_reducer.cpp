// The NCCL collectives on one GPU: the rendezvous through a host communicator, the communicator
// set-up, an in-place sum and ZeRO-1's gather on a stream (one rank: the result is the input, bit
// for bit). Two GPUs are needed for more; the 2-GPU device kind runs the data-parallel trainer
// (scripts/two_gpu_check.sh, CudaTrain.Zero1OverNcclOnTwoGpusIsBitIdenticalToPlain).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "cuda/common/cuda_check.h"
#include "cuda/common/device_buffer.h"
#include "dist/communicator.h"
#include "nsa/error.h"
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

// ZeRO-1's weight gather with one rank: the one part is the whole buffer, broadcast to itself;
// wrong offsets are refused by name.
TEST(NcclReducer, OneRankGatherLeavesTheBufferUnchanged) {
  const std::unique_ptr<Communicator> host = make_local_communicator();
  NcclReducer reducer(*host);
  std::vector<float> x(70001);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 613) * -0.21f + 3.0f;
  DeviceBuffer<float> d;
  d.resize(static_cast<int64_t>(x.size()));
  cudaStream_t stream = nullptr;
  NSA_CUDA_CHECK(cudaStreamCreate(&stream));
  NSA_CUDA_CHECK(cudaMemcpy(d.get(), x.data(), d.bytes(), cudaMemcpyHostToDevice));
  reducer.allgather_ranges(d.get(), Communicator::even_ranges(d.size(), 1), stream);
  std::vector<float> y(x.size());
  NSA_CUDA_CHECK(cudaMemcpyAsync(y.data(), d.get(), d.bytes(), cudaMemcpyDeviceToHost, stream));
  NSA_CUDA_CHECK(cudaStreamSynchronize(stream));
  EXPECT_EQ(x, y);
  try {
    reducer.allgather_ranges(d.get(), {0, 10, d.size()}, stream);
    ADD_FAILURE() << "three offsets for one rank were taken";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("3 offsets for 1 ranks, expected 2"), std::string::npos)
        << e.what();
  }
  NSA_CUDA_CHECK(cudaStreamDestroy(stream));
}
#endif

}  // namespace
}  // namespace nsa::cuda
