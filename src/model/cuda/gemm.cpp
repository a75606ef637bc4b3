// cuBLASLt GEMMs of the model (see gemm.h). Row-major X[r, c] is column-major Xᵀ[c, r], so each
// row-major product is issued as the transposed column-major one. The algorithm of each shape is
// chosen once by cuBLASLt's heuristic and cached.
#include "model/cuda/gemm.h"

#include <string>

#include "cuda/common/cublas_check.h"
#include "nsa/error.h"

namespace nsa::cuda {
namespace {

constexpr size_t kWorkspaceBytes = 32u << 20;

}  // namespace

Gemm::Gemm() {
  NSA_CUBLAS_CHECK(cublasLtCreate(&handle_));
  workspace_.resize(static_cast<int64_t>(kWorkspaceBytes));
}

Gemm::~Gemm() {
  if (handle_) cublasLtDestroy(handle_);
}

void Gemm::matmul(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const __nv_bfloat16* a,
                  int64_t lda, const __nv_bfloat16* b, int64_t ldb, GemmOut d, int64_t ldd,
                  float beta, cudaStream_t stream, const void* c) {
  if (m == 0 || n == 0) return;
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, ld = nullptr;
  NSA_CUBLAS_CHECK(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t opa = ta ? CUBLAS_OP_T : CUBLAS_OP_N,
                          opb = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  NSA_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof(opa)));
  NSA_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof(opb)));
  const cudaDataType_t dtype = d.bf16 ? CUDA_R_16BF : CUDA_R_32F;
  NSA_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, ta ? k : m, ta ? m : k, lda));
  NSA_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, tb ? n : k, tb ? k : n, ldb));
  NSA_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&ld, dtype, m, n, ldd));
  const Key key{ta, tb, m, n, k, lda, ldb, ldd, d.bf16, beta != 0.0f};
  auto it = algos_.find(key);
  if (it == algos_.end()) {
    cublasLtMatmulPreference_t pref = nullptr;
    NSA_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    const size_t ws = kWorkspaceBytes;
    NSA_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    NSA_CUBLAS_CHECK(
        cublasLtMatmulAlgoGetHeuristic(handle_, op, la, lb, ld, ld, pref, 1, &result, &found));
    cublasLtMatmulPreferenceDestroy(pref);
    NSA_CHECK(found > 0, "cuBLASLt has no algorithm for a ", m, "×", n, "×", k, " GEMM");
    it = algos_.emplace(key, result.algo).first;
  }
  const float alpha = 1.0f;
  // The heuristic saw C = D's layout either way, so a separate C runs the algorithm of the
  // in-place call (cuBLASLt reads C and writes D; they may differ when their layouts agree).
  NSA_CUBLAS_CHECK(cublasLtMatmul(handle_, op, &alpha, a, la, b, lb, &beta, c ? c : d.ptr, ld,
                                  d.ptr, ld, &it->second, workspace_.get(), kWorkspaceBytes,
                                  stream));
  cublasLtMatrixLayoutDestroy(la);
  cublasLtMatrixLayoutDestroy(lb);
  cublasLtMatrixLayoutDestroy(ld);
  cublasLtMatmulDescDestroy(op);
}

// yᵀ[out, T] = (Wcm[in, out])ᵀ · xcm[in, T]: row-major W [out, in] is column-major [in, out].
void Gemm::linear_forward(const __nv_bfloat16* x, const __nv_bfloat16* w, GemmOut y, int64_t T,
                          int64_t in, int64_t out, float beta, cudaStream_t stream) {
  matmul(true, false, out, T, in, w, in, x, in, y, out, beta, stream);
}

void Gemm::linear_forward_residual(const __nv_bfloat16* x, const __nv_bfloat16* w,
                                   const float* residual, float* y, int64_t T, int64_t in,
                                   int64_t out, cudaStream_t stream) {
  matmul(true, false, out, T, in, w, in, x, in, f32(y), out, 1.0f, stream, residual);
}

// dxᵀ[in, T] = Wcm[in, out] · dyᵀ[out, T].
void Gemm::linear_input_grad(const __nv_bfloat16* dy, const __nv_bfloat16* w, GemmOut dx, int64_t T,
                             int64_t in, int64_t out, float beta, cudaStream_t stream,
                             int64_t ld_dy) {
  matmul(false, false, in, T, out, w, in, dy, ld_dy ? ld_dy : out, dx, in, beta, stream);
}

// dWᵀ[in, out] += xᵀcm[in, T] · (dyᵀcm[out, T])ᵀ.
void Gemm::linear_weight_grad(const __nv_bfloat16* dy, const __nv_bfloat16* x, float* dw, int64_t T,
                              int64_t in, int64_t out, cudaStream_t stream, int64_t ld_dy) {
  matmul(false, true, in, out, T, x, in, dy, ld_dy ? ld_dy : out, GemmOut{dw, false}, in, 1.0f,
         stream);
}

}  // namespace nsa::cuda
