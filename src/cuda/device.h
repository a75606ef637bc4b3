// What CUDA devices this process can use. Safe to call without a driver or GPU: the CPU-only CI
// uses it to skip GPU tests explicitly.
#pragma once

#include <string>

namespace nsa::cuda {

// Number of usable devices; 0 when there is no driver or no GPU (never throws).
int device_count();
// Makes the process's GPU the one of its node-local rank (OMPI_COMM_WORLD_LOCAL_RANK, LOCAL_RANK or
// SLURM_LOCALID, modulo the device count; 0 for a single process) and returns its index.
int select_local_device();
// "NVIDIA H100 80GB HBM3 (sm_90, 79.1 GiB)" for `device`.
std::string device_description(int device);
// Streaming multiprocessors of the current device (launch heuristics size grids by it).
int current_sm_count();

}  // namespace nsa::cuda
