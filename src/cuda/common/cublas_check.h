// The cuBLAS / cuBLASLt member of the error-check family of cuda_check.h: NSA_CUBLAS_CHECK(call)
// throws nsa::Error naming the status, the call, file and line. NCCL's is dist/nccl/nccl_check.h.
#pragma once

#include <cublas_api.h>

namespace nsa::cuda {

[[noreturn]] void throw_cublas_error(cublasStatus_t status, const char* call, const char* file,
                                     int line);

}  // namespace nsa::cuda

#define NSA_CUBLAS_CHECK(call)                                                 \
  do {                                                                         \
    const cublasStatus_t nsa_status_ = (call);                                 \
    if (nsa_status_ != CUBLAS_STATUS_SUCCESS) {                                \
      ::nsa::cuda::throw_cublas_error(nsa_status_, #call, __FILE__, __LINE__); \
    }                                                                          \
  } while (0)
