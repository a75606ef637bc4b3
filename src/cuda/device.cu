// Device discovery and the CUDA error helpers (see device.h, common/cuda_check.h).
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "common/cuda_check.h"
#include "device.h"

namespace nsa::cuda {

void throw_cuda_error(cudaError_t err, const char* call, const char* file, int line) {
  cudaGetLastError();  // clear a non-sticky error so the next launch check does not see it again
  throw Error(str("CUDA error '", cudaGetErrorString(err), "' in ", call, " at ", file, ":", line));
}

bool sync_after_launch() {
  static const bool sync = [] {
    const char* v = std::getenv("NSA_CUDA_SYNC");
    return v && std::strcmp(v, "1") == 0;
  }();
  return sync;
}

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver" error
    return 0;
  }
  return n;
}

std::string device_description(int device) {
  cudaDeviceProp prop{};
  NSA_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  return str(prop.name, " (sm_", prop.major, prop.minor, ", ",
             static_cast<double>(prop.totalGlobalMem) / (1 << 30), " GiB)");
}

int select_local_device() {
  const int n = device_count();
  NSA_CHECK(n > 0, "--device cuda: no usable CUDA device (no GPU or no driver)");
  int local = 0;
  for (const char* var : {"OMPI_COMM_WORLD_LOCAL_RANK", "LOCAL_RANK", "SLURM_LOCALID"}) {
    if (const char* v = std::getenv(var)) {
      local = std::atoi(v);
      break;
    }
  }
  NSA_CUDA_CHECK(cudaSetDevice(local % n));
  return local % n;
}

int current_sm_count() {
  // Asked once per device: launch sequences call this on every pass.
  constexpr int kMaxDevices = 64;
  static std::atomic<int> cached[kMaxDevices] = {};
  int device = 0;
  NSA_CUDA_CHECK(cudaGetDevice(&device));
  if (device < kMaxDevices) {
    if (const int sms = cached[device].load(std::memory_order_relaxed)) return sms;
  }
  int sms = 0;
  NSA_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  if (device < kMaxDevices) cached[device].store(sms, std::memory_order_relaxed);
  return sms;
}

}  // namespace nsa::cuda
