// NSA_HOST_DEVICE: a function written once for the host and the device, in headers that stay plain
// C++ (no CUDA headers) so that the CPU tests compile and check them too.
#pragma once

#ifdef __CUDACC__
#define NSA_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define NSA_HOST_DEVICE inline
#endif
