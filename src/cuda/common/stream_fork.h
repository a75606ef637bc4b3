// A second stream and the events that fork work onto it and join it back – device-side waits
// only, so a CUDA graph can capture them – for independent kernel chains of one pass that would
// otherwise leave the GPU idle in each other's tails (the NSA passes, nsa_launch.cpp: the window
// forward beside the selected branch's; the selected backward beside the dense branches').
#pragma once

#include <cuda_runtime.h>

namespace nsa::cuda {

class StreamFork {
 public:
  static constexpr int kEvents = 4;
  StreamFork();  // the side stream at the device's highest priority, non-blocking
  ~StreamFork();
  StreamFork(const StreamFork&) = delete;
  StreamFork& operator=(const StreamFork&) = delete;

  cudaStream_t side() const { return side_; }
  cudaEvent_t event(int i) const { return events_[i]; }
  // Event i marks what `on` has issued so far; `waiter` waits for it (the last record of i).
  void record(int i, cudaStream_t on) const;
  void wait(cudaStream_t waiter, int i) const;

 private:
  cudaStream_t side_ = nullptr;
  cudaEvent_t events_[kEvents] = {};
};

}  // namespace nsa::cuda
