// Compression φ = mlp on the GPU: gather + two cuBLAS fp32 GEMMs forward, the chain rule backward
// (four GEMMs, deterministic column sums, a gather for the raw-row gradient). Math as in
// docs/nsa.md: z = concat_r(x_r + pos_r), y = W2ᵀ silu(W1ᵀ z + b1) + b2, per (token, group).
//
// The functions take one MLP's device pointers (CompressMlpArgs), so that the parameters,
// gradients and activations may live anywhere: in CompressMlp's own buffers (NsaCudaLayer), or in
// the caller's tensors and workspace (the C ABI, which recomputes the activations in the backward
// instead of keeping them between calls).
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "common/device_buffer.h"
#include "common/workspace.h"
#include "nsa/attention.h"
#include "nsa_params.h"

namespace nsa::cuda {

struct CompressMlpArgs {
  int64_t l = 0, D = 0, hidden = 0, rows = 0;  // rows = C·G (compressed tokens × groups)
  // Parameters: pos [l, D], w1 [l·D, hidden], b1 [hidden], w2 [hidden, D], b2 [D].
  const float *pos = nullptr, *w1 = nullptr, *b1 = nullptr, *w2 = nullptr, *b2 = nullptr;
  // Their gradients (overwritten by the backward).
  float *d_pos = nullptr, *d_w1 = nullptr, *d_b1 = nullptr, *d_w2 = nullptr, *d_b2 = nullptr;
  // Activations: z [rows, l·D], u and h [rows, hidden] from the forward; dh, dz backward scratch.
  float *z = nullptr, *u = nullptr, *h = nullptr, *dh = nullptr, *dz = nullptr;
  // cuBLAS's workspace on the call's stream (null: the handle's default pool). Set it where cuBLAS
  // must not allocate (CUDA graph capture).
  void* blas_workspace = nullptr;
  size_t blas_workspace_bytes = 0;
};

// cuBLAS workspace callers of the C ABI provide (the size cuBLAS recommends for Hopper).
constexpr size_t kCublasWorkspaceBytes = size_t{32} << 20;

// Takes z, u, h (and with `backward` dh, dz) for a.rows rows from ws.
void carve_compress_mlp_activations(CompressMlpArgs& a, bool backward, Workspace& ws);
// raw [T, G, D] (bf16, rows gathered through p.cmp_raw_start; rows whose start is −1 are padding
// and gather zeros) → z, u = W1ᵀ z + b1, h = silu(u).
void compress_mlp_hidden(cublasHandle_t blas, const NsaParams& p, const CompressMlpArgs& a,
                         const bf16* raw, cudaStream_t stream);
// h → out [C, G, D] = W2ᵀ h + b2.
void compress_mlp_output(cublasHandle_t blas, const CompressMlpArgs& a, float* out,
                         cudaStream_t stream);
// d_out [C, G, D] → parameter gradients (overwritten) and d_raw [T, G, D] (= or +=). Needs the
// forward's z, u, h in a.
void compress_mlp_backward(cublasHandle_t blas, const NsaParams& p, const CompressMlpArgs& a,
                           const float* d_out, float* d_raw, bool accumulate, cudaStream_t stream);

// One MLP (keys or values) with buffers of its own: parameters, their gradients and the
// activations kept for backward.
class CompressMlp {
 public:
  CompressMlp(int64_t l, int64_t D, int64_t hidden, int64_t rows);  // rows = C·G
  void set_params(const PhiMlpParams<float>& params);
  PhiMlpParams<float> download_grads() const;
  // Its pointers, for the functions above (the launch sequences of nsa_launch.h).
  CompressMlpArgs args();
  void poison();
  size_t device_bytes() const;

 private:
  int64_t l_, D_, hidden_, rows_;
  DeviceBuffer<float> pos_, w1_, b1_, w2_, b2_;
  DeviceBuffer<float> d_pos_, d_w1_, d_b1_, d_w2_, d_b2_;
  DeviceBuffer<float> z_, u_, h_, dh_, dz_;  // [rows, l·D], [rows, Hd] ×3, [rows, l·D]
};

}  // namespace nsa::cuda
