// The message of a failed cuBLAS / cuBLASLt call (see cublas_check.h).
#include "cublas_check.h"

#include "nsa/error.h"

namespace nsa::cuda {

void throw_cublas_error(cublasStatus_t status, const char* call, const char* file, int line) {
  throw Error(str("cuBLAS error ", cublasGetStatusName(status), " (", static_cast<int>(status),
                  ") in ", call, " at ", file, ":", line));
}

}  // namespace nsa::cuda
