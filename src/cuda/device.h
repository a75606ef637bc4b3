// What CUDA devices this process can use. Safe to call without a driver or GPU: the CPU-only CI
// uses it to skip GPU tests explicitly.
#pragma once

#include <string>

namespace nsa::cuda {

// Number of usable devices; 0 when there is no driver or no GPU (never throws).
int device_count();
// "NVIDIA H100 80GB HBM3 (sm_90, 79.1 GiB)" for `device`.
std::string device_description(int device);

}  // namespace nsa::cuda
