// NSA backward on the GPU, v1, part 1: the per-(row, head) preprocessing and dq.
//
// preprocess: d_gate_c = dO·o_c and delta_c = g_c·(dO·o_c) (= dO_c·o_c, the softmax-backward
// correction of branch c), one thread per (row, head).
// dq: one CTA per (row, group), as in the forward; for each head and branch it recomputes the
// probabilities from the saved log-sum-exp over the same key rows the forward used (sel_idx for
// the selected branch), then ds_j = p_j (g_c·dO·v_j − delta_c) and dq = scale Σ_j ds_j k_j, each
// output channel summed by one thread in ascending key order (deterministic).
#include "attend.cuh"
#include "common/cuda_check.h"
#include "nsa_kernels.h"

namespace nsa::cuda {
namespace {

constexpr int kThreads = 128;

__global__ void preprocess_kernel(const NsaParams p) {
  const int64_t th = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (th >= p.T * p.H) return;
  const bf16* d_o = p.d_o + th * p.dv;
  for (int c = 0; c < 3; ++c) {
    const bf16* o = p.o_branch[c] + th * p.dv;
    float acc = 0.0f;
    for (int64_t e = 0; e < p.dv; ++e) acc += __bfloat162float(d_o[e]) * __bfloat162float(o[e]);
    p.d_gate[c][th] = acc;
    p.delta[c][th] = __bfloat162float(p.gate[c][th]) * acc;
  }
}

// Adds scale·Σ_j ds_j k_j of one head and branch to dq_acc (shared, dk floats).
template <typename KT, typename Rows>
__device__ void dq_head_branch(const float* q, const float* d_o, const KT* K, const KT* V,
                               int64_t k_stride, int64_t v_stride, int64_t n, Rows rows,
                               const NsaParams& p, float lse, float delta, float gate, float* ds,
                               float* dq_acc) {
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
    const int64_t r = rows(j);
    const float s = p.scale * dot_row(q, K + r * k_stride, p.dk);
    const float prob = expf(s - lse);
    const float dp = gate * dot_row(d_o, V + r * v_stride, p.dv);
    ds[j] = prob * (dp - delta);
  }
  __syncthreads();
  for (int64_t e = threadIdx.x; e < p.dk; e += blockDim.x) {
    float acc = 0.0f;
    for (int64_t j = 0; j < n; ++j) acc += ds[j] * to_float(K[rows(j) * k_stride + e]);
    dq_acc[e] += p.scale * acc;
  }
  __syncthreads();
}

struct DqSmem {
  int64_t q, d_o, dq, ds, sel, total_floats;
};

__host__ __device__ DqSmem dq_smem(const NsaParams& p) {
  const int64_t max_keys = max_branch_keys(p);
  DqSmem s;
  s.q = 0;
  s.d_o = s.q + p.dk;
  s.dq = s.d_o + p.dv;
  s.ds = s.dq + p.dk;
  s.sel = s.ds + max_keys;
  s.total_floats = s.sel + p.n_sel;
  return s;
}

__global__ void __launch_bounds__(kThreads) dq_kernel(const NsaParams p) {
  extern __shared__ float smem[];
  const DqSmem L = dq_smem(p);
  float* q = smem + L.q;
  float* d_o = smem + L.d_o;
  float* dq = smem + L.dq;
  float* ds = smem + L.ds;
  int32_t* sel = reinterpret_cast<int32_t*>(smem + L.sel);

  const int64_t row = blockIdx.x, g = blockIdx.y;
  const int64_t n = p.seq_of_row[row], start = p.cu_seqlens[n], t = row - start;
  const int64_t G = p.G, dk = p.dk, dv = p.dv;
  int64_t n_blocks = 0;
  for (int64_t k = 0; k < p.n_sel; ++k) {
    const int32_t b = p.sel_idx[(row * G + g) * p.n_sel + k];
    if (threadIdx.x == 0) sel[k] = b;
    n_blocks += b >= 0;
  }
  const int64_t c_blk = t / p.l_sel;
  const int64_t n_sel_keys = (n_blocks - 1) * p.l_sel + (t - c_blk * p.l_sel + 1);
  const int64_t win_first = t - p.w + 1 > 0 ? t - p.w + 1 : 0;
  const int64_t nvis = num_visible(p, t);
  const float* kc = p.k_cmp + (p.cmp_offsets[n] * G + g) * dk;
  const float* vc = p.v_cmp + (p.cmp_offsets[n] * G + g) * dv;
  const int64_t raw = start * G + g;

  for (int64_t h = g * p.hpg; h < (g + 1) * p.hpg; ++h) {
    const int64_t th = row * p.H + h;
    for (int64_t e = threadIdx.x; e < dk; e += blockDim.x) {
      q[e] = __bfloat162float(p.q[th * dk + e]);
      dq[e] = 0.0f;
    }
    for (int64_t e = threadIdx.x; e < dv; e += blockDim.x)
      d_o[e] = __bfloat162float(p.d_o[th * dv + e]);
    __syncthreads();
    dq_head_branch(q, d_o, kc, vc, G * dk, G * dv, nvis, CompressedKeys{}, p, p.lse[0][th],
                   p.delta[0][th], __bfloat162float(p.gate[0][th]), ds, dq);
    dq_head_branch(q, d_o, p.k[1] + raw * dk, p.v[1] + raw * dv, G * dk, G * dv, n_sel_keys,
                   SelectedKeys{sel, p.l_sel}, p, p.lse[1][th], p.delta[1][th],
                   __bfloat162float(p.gate[1][th]), ds, dq);
    dq_head_branch(q, d_o, p.k[2] + raw * dk, p.v[2] + raw * dv, G * dk, G * dv, t - win_first + 1,
                   WindowKeys{win_first}, p, p.lse[2][th], p.delta[2][th],
                   __bfloat162float(p.gate[2][th]), ds, dq);
    for (int64_t e = threadIdx.x; e < dk; e += blockDim.x) p.d_q[th * dk + e] = dq[e];
    __syncthreads();
  }
}

}  // namespace

void launch_nsa_backward_preprocess(const NsaParams& p, cudaStream_t stream) {
  if (p.T == 0) return;
  const int64_t n = p.T * p.H;
  preprocess_kernel<<<static_cast<unsigned>((n + 255) / 256), 256, 0, stream>>>(p);
  NSA_CUDA_LAUNCH_CHECK();
}

void launch_nsa_backward_dq(const NsaParams& p, cudaStream_t stream) {
  const size_t smem = static_cast<size_t>(dq_smem(p).total_floats) * sizeof(float);
  NSA_CHECK(smem <= kMaxSmemBytes, "CUDA NSA backward (dq) needs ", smem,
            " bytes of shared memory: sequence too long for the v1 kernel");
  NSA_CUDA_CHECK(cudaFuncSetAttribute(dq_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      static_cast<int>(smem)));
  if (p.T == 0) return;
  dq_kernel<<<dim3(static_cast<unsigned>(p.T), static_cast<unsigned>(p.G)), kThreads, smem,
              stream>>>(p);
  NSA_CUDA_LAUNCH_CHECK();
}

}  // namespace nsa::cuda
