// StreamFork (stream_fork.h): one side stream and its events, created once and reused.
#include "stream_fork.h"

#include "cuda_check.h"

namespace nsa::cuda {

StreamFork::StreamFork() {
  int least = 0, greatest = 0;
  NSA_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  NSA_CUDA_CHECK(cudaStreamCreateWithPriority(&side_, cudaStreamNonBlocking, greatest));
  for (cudaEvent_t& e : events_) {
    NSA_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  }
}

StreamFork::~StreamFork() {
  for (cudaEvent_t e : events_) {
    if (e) cudaEventDestroy(e);
  }
  if (side_) cudaStreamDestroy(side_);
}

void StreamFork::record(int i, cudaStream_t on) const {
  NSA_CUDA_CHECK(cudaEventRecord(events_[i], on));
}

void StreamFork::wait(cudaStream_t waiter, int i) const {
  NSA_CUDA_CHECK(cudaStreamWaitEvent(waiter, events_[i], 0));
}

}  // namespace nsa::cuda
