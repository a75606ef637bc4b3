// Row-major GEMMs of the model on cuBLASLt: bf16 operands, fp32 accumulation, bf16 or fp32
// results, D = alpha·op(A)·op(B) + beta·D in place (beta = 1 accumulates: weight gradients over
// micro-batches, sums of input gradients), or D = op(A)·op(B) + C with C another fp32 matrix of
// D's shape (the residual add in the GEMM's epilogue: x2 = x + o·Woᵀ without a copy of x).
//
// The three products of a linear layer y = x·Wᵀ (W [out, in], row-major as in checkpoints):
//   forward      y[T, out]   = x[T, in] · Wᵀ
//   input grad   dx[T, in]   = dy[T, out] · W
//   weight grad  dW[out, in] += dyᵀ · x
#pragma once

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <tuple>

#include "cuda/common/device_buffer.h"

namespace nsa::cuda {

// A GEMM result: bf16 or fp32 device memory.
struct GemmOut {
  void* ptr;
  bool bf16;
};
inline GemmOut f32(float* p) {
  return GemmOut{p, false};
}
inline GemmOut b16(__nv_bfloat16* p) {
  return GemmOut{p, true};
}

class Gemm {
 public:
  Gemm();
  ~Gemm();
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;

  // y (+)= x·Wᵀ: x [T, in], W [out, in].
  void linear_forward(const __nv_bfloat16* x, const __nv_bfloat16* w, GemmOut y, int64_t T,
                      int64_t in, int64_t out, float beta, cudaStream_t stream);
  // y = residual + x·Wᵀ (fp32 y and residual [T, out]; bitwise the copy of residual into y
  // followed by linear_forward with beta = 1).
  void linear_forward_residual(const __nv_bfloat16* x, const __nv_bfloat16* w,
                               const float* residual, float* y, int64_t T, int64_t in, int64_t out,
                               cudaStream_t stream);
  // dx (+)= dy·W; dy's rows ld_dy elements apart (0: out – a column block of a wider dy
  // otherwise).
  void linear_input_grad(const __nv_bfloat16* dy, const __nv_bfloat16* w, GemmOut dx, int64_t T,
                         int64_t in, int64_t out, float beta, cudaStream_t stream,
                         int64_t ld_dy = 0);
  // dW += dyᵀ·x (fp32); ld_dy as above.
  void linear_weight_grad(const __nv_bfloat16* dy, const __nv_bfloat16* x, float* dw, int64_t T,
                          int64_t in, int64_t out, cudaStream_t stream, int64_t ld_dy = 0);

 private:
  // Column-major D[m, n] = alpha·op(A)·op(B) + beta·D.
  // c: the C matrix (D's type and layout), null for D itself.
  void matmul(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const __nv_bfloat16* a,
              int64_t lda, const __nv_bfloat16* b, int64_t ldb, GemmOut d, int64_t ldd, float beta,
              cudaStream_t stream, const void* c = nullptr);

  cublasLtHandle_t handle_ = nullptr;
  DeviceBuffer<char> workspace_;
  // (transposes, m, n, k, lda, ldb, ldd, bf16 result, beta ≠ 0).
  using Key =
      std::tuple<bool, bool, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, bool, bool>;
  std::map<Key, cublasLtMatmulAlgo_t> algos_;
};

}  // namespace nsa::cuda
