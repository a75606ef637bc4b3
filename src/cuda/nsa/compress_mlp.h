// Compression φ = mlp on the GPU: gather + two cuBLAS fp32 GEMMs forward, the chain rule backward
// (four GEMMs, deterministic column sums, a gather for the raw-row gradient). Math as in
// docs/nsa.md: z = concat_r(x_r + pos_r), y = W2ᵀ silu(W1ᵀ z + b1) + b2, per (token, group).
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "common/device_buffer.h"
#include "nsa/attention.h"
#include "nsa_params.h"

namespace nsa::cuda {

// One MLP (keys or values): parameters, their gradients and the activations kept for backward.
class CompressMlp {
 public:
  CompressMlp(int64_t l, int64_t D, int64_t hidden, int64_t rows);  // rows = C·G
  void set_params(const PhiMlpParams<float>& params);
  PhiMlpParams<float> download_grads() const;
  // raw [T, G, D] (bf16, rows gathered through p.cmp_raw_start) → out [C, G, D].
  void forward(cublasHandle_t blas, const NsaParams& p, const bf16* raw, float* out,
               cudaStream_t stream);
  // d_out [C, G, D] → parameter gradients (overwritten) and d_raw [T, G, D] (= or +=).
  void backward(cublasHandle_t blas, const NsaParams& p, const float* d_out, float* d_raw,
                bool accumulate, cudaStream_t stream);
  void poison();
  size_t device_bytes() const;

 private:
  int64_t l_, D_, hidden_, rows_;
  DeviceBuffer<float> pos_, w1_, b1_, w2_, b2_;
  DeviceBuffer<float> d_pos_, d_w1_, d_b1_, d_w2_, d_b2_;
  DeviceBuffer<float> z_, u_, h_, dh_, dz_;  // [rows, l·D], [rows, Hd] ×3, [rows, l·D]
};

}  // namespace nsa::cuda
