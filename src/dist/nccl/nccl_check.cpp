// The message of a failed NCCL call (see nccl_check.h).
#include "nccl_check.h"

#include "nsa/error.h"

namespace nsa::cuda {

void throw_nccl_error(ncclResult_t result, const char* call, const char* file, int line) {
  throw Error(str("NCCL error '", ncclGetErrorString(result), "' in ", call, " at ", file, ":",
                  line, " (set NCCL_DEBUG=INFO for NCCL's own account)"));
}

}  // namespace nsa::cuda
