// The C ABI's CUDA entry points in a build without CUDA (see nsa_capi.h): each says so, so that
// callers can test for the backend with nsa_cuda_available and get a clear message otherwise.
#include "capi_common.h"

namespace {

constexpr const char* kNoCuda =
    "libnsa_capi was built without CUDA (configure with the CUDA toolkit, NSA_CUDA=AUTO or ON, "
    "to build the GPU kernels)";

}  // namespace

extern "C" {

int32_t nsa_cuda_available(char* err, size_t err_size) {
  return nsa::capi::unavailable(kNoCuda, err, err_size);
}

int32_t nsa_cuda_compressed_rows(const NsaAttnConfig*, int64_t, int64_t, int64_t*, char* err,
                                 size_t err_size) {
  return nsa::capi::unavailable(kNoCuda, err, err_size);
}

int32_t nsa_cuda_workspace_bytes(const NsaAttnConfig*, int64_t, int64_t, int32_t, int32_t, size_t*,
                                 char* err, size_t err_size) {
  return nsa::capi::unavailable(kNoCuda, err, err_size);
}

int32_t nsa_attention_forward_cuda(const NsaAttnConfig*, const int64_t*, int64_t,
                                   const NsaAttnTensors*, const NsaAttnSaved*, void*, size_t,
                                   int32_t, void*, char* err, size_t err_size) {
  return nsa::capi::unavailable(kNoCuda, err, err_size);
}

int32_t nsa_attention_backward_cuda(const NsaAttnConfig*, const int64_t*, int64_t,
                                    const NsaAttnTensors*, const NsaAttnSaved*, const NsaTensorRef*,
                                    const NsaAttnTensors*, void*, size_t, int32_t, void*, char* err,
                                    size_t err_size) {
  return nsa::capi::unavailable(kNoCuda, err, err_size);
}

int32_t nsa_attention_backward_cuda_bf16(const NsaAttnConfig*, const int64_t*, int64_t,
                                         const NsaAttnTensors*, const NsaAttnSaved*,
                                         const NsaTensorRef*, const NsaAttnTensors*, void*, size_t,
                                         int32_t, void*, char* err, size_t err_size) {
  return nsa::capi::unavailable(kNoCuda, err, err_size);
}

}  // extern "C"
