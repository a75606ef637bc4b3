// Compression φ = mlp on the GPU (see compress_mlp.h). Row-major matrices are handed to
// column-major cuBLAS as their transposes: C = A·B (row-major) is Cᵀ = Bᵀ·Aᵀ (column-major).
// cuBLAS runs in its default fp32 math mode (no TF32) and is deterministic for a fixed problem.
#include <algorithm>
#include <utility>

#include "common/cublas_check.h"
#include "common/cuda_check.h"
#include "compress_mlp.h"

namespace nsa::cuda {
namespace {

constexpr int kThreads = 256;

unsigned blocks_for(int64_t n) {
  return static_cast<unsigned>((n + kThreads - 1) / kThreads);
}

// Row-major C[m, n] = op(A)·op(B) with A, B row-major; op = transpose when the flag is set.
// cublasSetStream resets the handle's workspace to its default pool, so a caller's workspace is set
// after it, on every call.
void gemm(cublasHandle_t h, const CompressMlpArgs& a, bool ta, bool tb, int64_t m, int64_t n,
          int64_t k, const float* A, const float* B, float* C, cudaStream_t stream) {
  NSA_CUBLAS_CHECK(cublasSetStream(h, stream));
  if (a.blas_workspace) {
    NSA_CUBLAS_CHECK(cublasSetWorkspace(h, a.blas_workspace, a.blas_workspace_bytes));
  }
  const float one = 1.0f, zero = 0.0f;
  // Column-major view: Cᵀ[n, m] = op(B)ᵀ · op(A)ᵀ.
  const int lda = static_cast<int>(ta ? m : k), ldb = static_cast<int>(tb ? k : n);
  NSA_CUBLAS_CHECK(cublasSgemm(h, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N,
                               static_cast<int>(n), static_cast<int>(m), static_cast<int>(k), &one,
                               B, ldb, A, lda, &zero, C, static_cast<int>(n)));
}

// z[(i·G + g), r·D + c] = raw[(start_i + r)·G + g, c] + pos[r, c].
__global__ void gather_kernel(const bf16* __restrict__ raw, const float* __restrict__ pos,
                              const int64_t* __restrict__ raw_start, float* __restrict__ z,
                              int64_t rows, int64_t G, int64_t l, int64_t D) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= rows * l * D) return;
  const int64_t row = idx / (l * D), rc = idx % (l * D), r = rc / D, c = rc % D;
  const int64_t i = row / G, g = row % G;
  if (raw_start[i] < 0) {  // a padding row of a capacity-sized compressed buffer (device_layout.h)
    z[idx] = 0.0f;
    return;
  }
  z[idx] = __bfloat162float(raw[((raw_start[i] + r) * G + g) * D + c]) + pos[rc];
}

// u += b1 (kept as the pre-activation), h = silu(u).
__global__ void bias_silu_kernel(float* __restrict__ u, const float* __restrict__ b1,
                                 float* __restrict__ h, int64_t rows, int64_t hid) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= rows * hid) return;
  const float x = u[idx] + b1[idx % hid];
  u[idx] = x;
  h[idx] = x / (1.0f + expf(-x));
}

__global__ void add_bias_kernel(float* __restrict__ y, const float* __restrict__ b, int64_t rows,
                                int64_t n) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx < rows * n) y[idx] += b[idx % n];
}

// dh ← dh ⊙ silu'(u), silu'(u) = σ(u)(1 + u(1 − σ(u))).
__global__ void silu_backward_kernel(float* __restrict__ dh, const float* __restrict__ u,
                                     int64_t n) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= n) return;
  const float s = 1.0f / (1.0f + expf(-u[idx]));
  dh[idx] *= s * (1.0f + u[idx] * (1.0f - s));
}

// out[j] = Σ_rows a[row, j], rows in ascending order (deterministic).
__global__ void column_sum_kernel(const float* __restrict__ a, float* __restrict__ out,
                                  int64_t rows, int64_t n) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= n) return;
  float acc = 0.0f;
  for (int64_t r = 0; r < rows; ++r) acc += a[r * n + j];
  out[j] = acc;
}

// d_raw[row, g, c] (=, +=) Σ over the compressed tokens i that cover row, ascending, of
// dz[(i·G + g), (t − i·d)·D + c].
__global__ void scatter_raw_kernel(const NsaParams p, const float* __restrict__ dz,
                                   float* __restrict__ d_raw, int64_t D, bool accumulate) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t G = p.G;
  if (idx >= p.T * G * D) return;
  const int64_t row = idx / (G * D), g = (idx / D) % G, c = idx % D;
  const int64_t n = p.seq_of_row[row], t = row - p.cu_seqlens[n];
  const int64_t nc = p.cmp_offsets[n + 1] - p.cmp_offsets[n];
  const int64_t first = t - p.l + 1 > 0 ? (t - p.l + 1 + p.d - 1) / p.d : 0;
  const int64_t last = t / p.d < nc - 1 ? t / p.d : nc - 1;
  float acc = 0.0f;
  for (int64_t i = first; i <= last; ++i) {
    acc += dz[((p.cmp_offsets[n] + i) * G + g) * p.l * D + (t - i * p.d) * D + c];
  }
  d_raw[idx] = accumulate ? d_raw[idx] + acc : acc;
}

void upload_tensor(DeviceBuffer<float>& dst, const Tensor<float>& t) {
  dst.upload(t.ptr(), t.numel());
}

Tensor<float> download(const DeviceBuffer<float>& b, Shape shape) {
  const std::vector<float> host = b.download();
  Tensor<float> out(std::move(shape));
  std::copy(host.begin(), host.end(), out.data.begin());
  return out;
}

}  // namespace

void carve_compress_mlp_activations(CompressMlpArgs& a, bool backward, Workspace& ws) {
  a.z = ws.take<float>(a.rows * a.l * a.D);
  a.u = ws.take<float>(a.rows * a.hidden);
  a.h = ws.take<float>(a.rows * a.hidden);
  a.dh = backward ? ws.take<float>(a.rows * a.hidden) : nullptr;
  a.dz = backward ? ws.take<float>(a.rows * a.l * a.D) : nullptr;
}

void compress_mlp_hidden(cublasHandle_t blas, const NsaParams& p, const CompressMlpArgs& a,
                         const bf16* raw, cudaStream_t stream) {
  if (a.rows == 0) return;
  const int64_t in = a.l * a.D;
  gather_kernel<<<blocks_for(a.rows * in), kThreads, 0, stream>>>(raw, a.pos, p.cmp_raw_start, a.z,
                                                                  a.rows, p.G, a.l, a.D);
  NSA_CUDA_LAUNCH_CHECK();
  gemm(blas, a, false, false, a.rows, a.hidden, in, a.z, a.w1, a.u, stream);
  bias_silu_kernel<<<blocks_for(a.rows * a.hidden), kThreads, 0, stream>>>(a.u, a.b1, a.h, a.rows,
                                                                           a.hidden);
  NSA_CUDA_LAUNCH_CHECK();
}

void compress_mlp_output(cublasHandle_t blas, const CompressMlpArgs& a, float* out,
                         cudaStream_t stream) {
  if (a.rows == 0) return;
  gemm(blas, a, false, false, a.rows, a.D, a.hidden, a.h, a.w2, out, stream);
  add_bias_kernel<<<blocks_for(a.rows * a.D), kThreads, 0, stream>>>(out, a.b2, a.rows, a.D);
  NSA_CUDA_LAUNCH_CHECK();
}

void compress_mlp_backward(cublasHandle_t blas, const NsaParams& p, const CompressMlpArgs& a,
                           const float* d_out, float* d_raw, bool accumulate, cudaStream_t stream) {
  const int64_t in = a.l * a.D, hid = a.hidden, rows = a.rows, D = a.D;
  if (rows == 0) {  // no compressed token: zero parameter gradients, nothing reaches raw rows
    for (auto [ptr, n] :
         {std::pair{a.d_pos, in}, std::pair{a.d_w1, in * hid}, std::pair{a.d_b1, hid},
          std::pair{a.d_w2, hid * D}, std::pair{a.d_b2, D}}) {
      NSA_CUDA_CHECK(cudaMemsetAsync(ptr, 0, sizeof(float) * n, stream));
    }
    if (!accumulate && p.T > 0) {
      NSA_CUDA_CHECK(cudaMemsetAsync(d_raw, 0, sizeof(float) * p.T * p.G * D, stream));
    }
    return;
  }
  column_sum_kernel<<<blocks_for(D), kThreads, 0, stream>>>(d_out, a.d_b2, rows, D);
  NSA_CUDA_LAUNCH_CHECK();
  gemm(blas, a, true, false, hid, D, rows, a.h, d_out, a.d_w2, stream);  // hᵀ·dy
  gemm(blas, a, false, true, rows, hid, D, d_out, a.w2, a.dh, stream);   // dy·W2ᵀ
  silu_backward_kernel<<<blocks_for(rows * hid), kThreads, 0, stream>>>(a.dh, a.u, rows * hid);
  NSA_CUDA_LAUNCH_CHECK();
  column_sum_kernel<<<blocks_for(hid), kThreads, 0, stream>>>(a.dh, a.d_b1, rows, hid);
  NSA_CUDA_LAUNCH_CHECK();
  gemm(blas, a, true, false, in, hid, rows, a.z, a.dh, a.d_w1, stream);  // zᵀ·du
  gemm(blas, a, false, true, rows, in, hid, a.dh, a.w1, a.dz, stream);   // du·W1ᵀ
  column_sum_kernel<<<blocks_for(in), kThreads, 0, stream>>>(a.dz, a.d_pos, rows, in);
  NSA_CUDA_LAUNCH_CHECK();
  if (p.T == 0) return;
  scatter_raw_kernel<<<blocks_for(p.T * p.G * D), kThreads, 0, stream>>>(p, a.dz, d_raw, D,
                                                                         accumulate);
  NSA_CUDA_LAUNCH_CHECK();
}

CompressMlp::CompressMlp(int64_t l, int64_t D, int64_t hidden, int64_t rows)
    : l_(l), D_(D), hidden_(hidden), rows_(rows) {
  for (auto* b : {&pos_, &d_pos_}) b->resize(l * D);
  for (auto* b : {&w1_, &d_w1_}) b->resize(l * D * hidden);
  for (auto* b : {&b1_, &d_b1_}) b->resize(hidden);
  for (auto* b : {&w2_, &d_w2_}) b->resize(hidden * D);
  for (auto* b : {&b2_, &d_b2_}) b->resize(D);
  z_.resize(rows * l * D);
  dz_.resize(rows * l * D);
  u_.resize(rows * hidden);
  h_.resize(rows * hidden);
  dh_.resize(rows * hidden);
}

void CompressMlp::set_params(const PhiMlpParams<float>& p) {
  upload_tensor(pos_, p.pos);
  upload_tensor(w1_, p.w1);
  upload_tensor(b1_, p.b1);
  upload_tensor(w2_, p.w2);
  upload_tensor(b2_, p.b2);
}

PhiMlpParams<float> CompressMlp::download_grads() const {
  return {download(d_pos_, {l_, D_}), download(d_w1_, {l_ * D_, hidden_}),
          download(d_b1_, {hidden_}), download(d_w2_, {hidden_, D_}), download(d_b2_, {D_})};
}

CompressMlpArgs CompressMlp::args() {
  CompressMlpArgs a;
  a.l = l_, a.D = D_, a.hidden = hidden_, a.rows = rows_;
  a.pos = pos_.get(), a.w1 = w1_.get(), a.b1 = b1_.get(), a.w2 = w2_.get(), a.b2 = b2_.get();
  a.d_pos = d_pos_.get(), a.d_w1 = d_w1_.get(), a.d_b1 = d_b1_.get(), a.d_w2 = d_w2_.get();
  a.d_b2 = d_b2_.get();
  a.z = z_.get(), a.u = u_.get(), a.h = h_.get(), a.dh = dh_.get(), a.dz = dz_.get();
  return a;
}

void CompressMlp::poison() {
  for (auto* b : {&d_pos_, &d_w1_, &d_b1_, &d_w2_, &d_b2_}) b->poison();
}

size_t CompressMlp::device_bytes() const {
  size_t total = 0;
  for (const auto* b : {&pos_, &w1_, &b1_, &w2_, &b2_, &d_pos_, &d_w1_, &d_b1_, &d_w2_, &d_b2_, &z_,
                        &u_, &h_, &dh_, &dz_}) {
    total += b->bytes();
  }
  return total;
}

}  // namespace nsa::cuda
