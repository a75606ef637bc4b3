// The NCCL member of the error-check family of cuda/common/cuda_check.h: NSA_NCCL_CHECK(call)
// throws nsa::Error naming NCCL's message, the call, file and line.
#pragma once

#include <nccl.h>

namespace nsa::cuda {

[[noreturn]] void throw_nccl_error(ncclResult_t result, const char* call, const char* file,
                                   int line);

}  // namespace nsa::cuda

#define NSA_NCCL_CHECK(call)                                                 \
  do {                                                                       \
    const ncclResult_t nsa_result_ = (call);                                 \
    if (nsa_result_ != ncclSuccess) {                                        \
      ::nsa::cuda::throw_nccl_error(nsa_result_, #call, __FILE__, __LINE__); \
    }                                                                        \
  } while (0)
