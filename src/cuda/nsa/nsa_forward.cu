// NSA forward on the GPU, v1: one fused, group-centric kernel per (query row, group).
//
// For query t of group g the CTA: loads the group's h query heads; runs the compressed branch for
// each head (scores, softmax, output, log-sum-exp), summing each compressed token's probability
// over the heads; maps the sums onto selection blocks; picks the top-n with the exact tie rule
// (one warp, n_sel − forced rounds of arg-max); runs the selected and window branches for each
// head over the chosen rows; and writes o = Σ_c g_c·o_c. Everything the group's heads share
// (scores, block choice) is computed once. The S × S/d probability matrix never exists: a CTA
// holds one head's probabilities (≤ S/d floats) at a time.
//
// Variants: v1 (this) – SIMT fp32 math on bf16 inputs, deterministic. Tensor-core tiles (heads as
// the M dimension, as in the paper's kernel) are the next step.
#include "attend.cuh"
#include "common/cuda_check.h"
#include "nsa_kernels.h"

namespace nsa::cuda {
namespace {

constexpr int kThreads = 128;

struct ForwardSmem {
  int64_t q, o_acc, out, probs, gprob, bscore, red, sel, total_floats;
};

__host__ __device__ ForwardSmem forward_smem(const NsaParams& p) {
  const int64_t max_nc = max_compressed_tokens(p), max_keys = max_branch_keys(p);
  const int64_t max_nb = (p.max_len + p.l_sel - 1) / p.l_sel + 1;
  ForwardSmem s;
  s.q = 0;
  s.o_acc = s.q + p.hpg * p.dk;
  s.out = s.o_acc + p.hpg * p.dv;
  s.probs = s.out + p.dv;
  s.gprob = s.probs + max_keys;
  s.bscore = s.gprob + max_nc;
  s.red = s.bscore + max_nb;
  s.sel = s.red + 33;
  s.total_floats = s.sel + p.n_sel;
  return s;
}

__global__ void __launch_bounds__(kThreads) nsa_forward_kernel(const NsaParams p) {
  extern __shared__ float smem[];
  const ForwardSmem L = forward_smem(p);
  float* q_s = smem + L.q;
  float* o_acc = smem + L.o_acc;
  float* out = smem + L.out;
  float* probs = smem + L.probs;
  float* gprob = smem + L.gprob;
  float* bscore = smem + L.bscore;
  float* red = smem + L.red;
  int32_t* sel = reinterpret_cast<int32_t*>(smem + L.sel);

  const int64_t row = blockIdx.x, g = blockIdx.y;
  const int64_t n = p.seq_of_row[row], start = p.cu_seqlens[n], t = row - start;
  const int64_t hpg = p.hpg, dk = p.dk, dv = p.dv, G = p.G, H = p.H;
  const int64_t h0 = g * hpg;

  for (int64_t i = threadIdx.x; i < hpg * dk; i += blockDim.x) {
    q_s[i] = __bfloat162float(p.q[(row * H + h0) * dk + i]);
  }
  for (int64_t i = threadIdx.x; i < hpg * dv; i += blockDim.x) o_acc[i] = 0.0f;
  const int64_t nvis = num_visible(p, t);
  for (int64_t i = threadIdx.x; i < nvis; i += blockDim.x) gprob[i] = 0.0f;
  __syncthreads();

  // Compressed branch, head by head; gprob[i] accumulates over heads in ascending order.
  const float* kc = p.k_cmp + (p.cmp_offsets[n] * G + g) * dk;
  const float* vc = p.v_cmp + (p.cmp_offsets[n] * G + g) * dv;
  for (int64_t hh = 0; hh < hpg; ++hh) {
    const int64_t th = row * H + h0 + hh;
    const float lse = attend_head(q_s + hh * dk, kc, vc, G * dk, G * dv, nvis, CompressedKeys{}, dk,
                                  dv, p.scale, probs, red, out);
    const float gate = __bfloat162float(p.gate[0][th]);
    for (int64_t j = threadIdx.x; j < nvis; j += blockDim.x) gprob[j] += probs[j];
    for (int64_t c = threadIdx.x; c < dv; c += blockDim.x) {
      p.o_branch[0][th * dv + c] = __float2bfloat16(out[c]);
      o_acc[hh * dv + c] += gate * out[c];
    }
    if (threadIdx.x == 0) p.lse[0][th] = lse;
    __syncthreads();
  }

  // Block scores: block j sums (P[i]·overlap)/l over overlapping tokens i in ascending order.
  const int64_t c_blk = t / p.l_sel;
  const float inv_l = 1.0f / static_cast<float>(p.l);
  for (int64_t j = threadIdx.x; j <= c_blk; j += blockDim.x) {
    const int64_t lo_row = j * p.l_sel, hi_row = (j + 1) * p.l_sel;
    int64_t i = lo_row - p.l + 1 > 0 ? (lo_row - p.l + 1 + p.d - 1) / p.d : 0;
    float score = 0.0f;
    for (; i < nvis && i * p.d < hi_row; ++i) {
      const int64_t a = i * p.d, b = a + p.l;
      const int64_t overlap = (b < hi_row ? b : hi_row) - (a > lo_row ? a : lo_row);
      if (overlap > 0) score += gprob[i] * static_cast<float>(overlap) * inv_l;
    }
    bscore[j] = score;
  }
  __syncthreads();

  // Top-n (warp 0): forced 0, c−1, c; then arg-max rounds over candidates 1..c−2 by
  // (score desc, index asc). A chosen candidate's score is set to −1 (scores are ≥ 0).
  if (threadIdx.x < 32) {
    const int lane = threadIdx.x;
    int n_chosen = 0;
    if (lane == 0) {
      sel[n_chosen] = 0;
      if (c_blk - 1 > 0) sel[++n_chosen] = static_cast<int32_t>(c_blk - 1);
      if (c_blk > 0) sel[++n_chosen] = static_cast<int32_t>(c_blk);
    }
    n_chosen = 1 + (c_blk - 1 > 0) + (c_blk > 0);
    while (n_chosen < p.n_sel) {
      float best = -1.0f;
      int64_t best_j = INT64_MAX;
      for (int64_t j = 1 + lane; j <= c_blk - 2; j += 32) {
        const float s = bscore[j];
        if (s >= 0.0f && (s > best || (s == best && j < best_j))) best = s, best_j = j;
      }
      for (int o = 16; o > 0; o >>= 1) {
        const float other = __shfl_xor_sync(0xffffffffu, best, o);
        const int64_t other_j = __shfl_xor_sync(0xffffffffu, best_j, o);
        if (other > best || (other == best && other_j < best_j)) best = other, best_j = other_j;
      }
      if (best_j == INT64_MAX) break;
      if (lane == 0) {
        sel[n_chosen] = static_cast<int32_t>(best_j);
        bscore[best_j] = -1.0f;
      }
      ++n_chosen;
      __syncwarp();
    }
    if (lane == 0) {
      for (int a = 1; a < n_chosen; ++a) {  // insertion sort: at most n_sel entries
        const int32_t x = sel[a];
        int b = a - 1;
        while (b >= 0 && sel[b] > x) sel[b + 1] = sel[b], --b;
        sel[b + 1] = x;
      }
      int32_t* dst = p.sel_idx + (row * G + g) * p.n_sel;
      for (int a = 0; a < p.n_sel; ++a) dst[a] = a < n_chosen ? sel[a] : -1;
      red[32] = static_cast<float>(n_chosen);
    }
  }
  __syncthreads();
  const int64_t n_blocks = static_cast<int64_t>(red[32]);
  const int64_t n_sel_keys = (n_blocks - 1) * p.l_sel + (t - c_blk * p.l_sel + 1);
  const int64_t win_first = t - p.w + 1 > 0 ? t - p.w + 1 : 0;

  const int64_t raw = start * G + g;
  for (int64_t hh = 0; hh < hpg; ++hh) {
    const int64_t th = row * H + h0 + hh;
    const float* qh = q_s + hh * dk;
    const float lse_sel =
        attend_head(qh, p.k[1] + raw * dk, p.v[1] + raw * dv, G * dk, G * dv, n_sel_keys,
                    SelectedKeys{sel, p.l_sel}, dk, dv, p.scale, probs, red, out);
    const float g_sel = __bfloat162float(p.gate[1][th]);
    for (int64_t c = threadIdx.x; c < dv; c += blockDim.x) {
      p.o_branch[1][th * dv + c] = __float2bfloat16(out[c]);
      o_acc[hh * dv + c] += g_sel * out[c];
    }
    __syncthreads();
    const float lse_win =
        attend_head(qh, p.k[2] + raw * dk, p.v[2] + raw * dv, G * dk, G * dv, t - win_first + 1,
                    WindowKeys{win_first}, dk, dv, p.scale, probs, red, out);
    const float g_win = __bfloat162float(p.gate[2][th]);
    for (int64_t c = threadIdx.x; c < dv; c += blockDim.x) {
      p.o_branch[2][th * dv + c] = __float2bfloat16(out[c]);
      p.o[th * dv + c] = __float2bfloat16(o_acc[hh * dv + c] + g_win * out[c]);
    }
    if (threadIdx.x == 0) p.lse[1][th] = lse_sel, p.lse[2][th] = lse_win;
    __syncthreads();
  }
}

}  // namespace

size_t nsa_forward_smem_bytes(const NsaParams& p) {
  return static_cast<size_t>(forward_smem(p).total_floats) * sizeof(float);
}

void launch_nsa_forward(const NsaParams& p, cudaStream_t stream) {
  const size_t smem = nsa_forward_smem_bytes(p);
  NSA_CHECK(smem <= kMaxSmemBytes, "CUDA NSA forward needs ", smem,
            " bytes of shared memory for max sequence length ", p.max_len, " (limit ",
            kMaxSmemBytes, "): sequence too long for the v1 kernel");
  NSA_CUDA_CHECK(cudaFuncSetAttribute(
      nsa_forward_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  if (p.T == 0) return;
  nsa_forward_kernel<<<dim3(static_cast<unsigned>(p.T), static_cast<unsigned>(p.G)), kThreads, smem,
                       stream>>>(p);
  NSA_CUDA_LAUNCH_CHECK();
}

}  // namespace nsa::cuda
