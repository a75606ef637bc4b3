// NSA backward on tensor cores (v2), part 1: the per-(row, head) preprocessing and dq.
//
// preprocess: d_gate_c = dO·o_c and delta_c = g_c·(dO·o_c) (= dO_c·o_c, the softmax-backward
// correction of branch c), one thread per (row, head).
// dq: the forward's tiling again – dense branches per (64 query rows, head) over key tiles in
// shared memory, the selected branch per (query row, group) with the heads as M – recomputing
// P = exp(S − lse) from the saved log-sum-exp: dS = P ∘ (g_c·dO·Vᵀ − delta_c), dq += scale·dS·K.
// The three branches run in the order compressed (writes dq), selected, window (add): fixed
// order, no atomics, so dq is bit-identical from run to run.
#include "common/cuda_check.h"
#include "head_dims.h"
#include "nsa_kernels.h"
#include "tiles.cuh"

namespace nsa::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kSelChunk = 32;  // key rows per staged chunk (selected branch)
static_assert(kQueryTileRows == 16 * kWarps, "one warp per 16 query rows");

// Key rows per shared tile: 32 for the widest heads keeps dq, Q, dO, S and dP in registers.
template <int DK>
constexpr int dq_key_tile() {
  return DK > 128 ? 32 : 64;
}

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

// Per row half (r = 0: gid, 1: gid + 8): lse (log2 units), delta and gate of branch c.
struct RowStats {
  float lse2[2], delta[2], gate[2];
  __device__ void load(const NsaParams& p, int c, int64_t th_lo, int64_t th_hi, bool ok_lo,
                       bool ok_hi) {
    const int64_t th[2] = {th_lo, th_hi};
    const bool ok[2] = {ok_lo, ok_hi};
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      lse2[r] = ok[r] ? p.lse[c][th[r]] * kLog2e : -INFINITY;
      delta[r] = ok[r] ? p.delta[c][th[r]] : 0.0f;
      gate[r] = ok[r] ? __bfloat162float(p.gate[c][th[r]]) : 0.0f;
    }
  }
};

// s := dS from S (raw scores) and dP, where `visible(e)` says which elements count.
template <int NT, typename Visible>
__device__ __forceinline__ void scores_to_ds(float s[][4], const float dp[][4], const RowStats& st,
                                             float sl2, Visible visible) {
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int r = e >> 1;
      const float pr = visible(nt, e) ? exp2f(s[nt][e] * sl2 - st.lse2[r]) : 0.0f;
      s[nt][e] = pr * (st.gate[r] * dp[nt][e] - st.delta[r]);
    }
  }
}

// d_q[th] (=, or +=) scale·dq for one row half.
template <int DK>
__device__ void store_dq(const NsaParams& p, const float dq[][4], int r, int64_t th,
                         bool accumulate) {
  const int tq = threadIdx.x & 3;
  float* dst = p.d_q + th * DK;
#pragma unroll
  for (int nt = 0; nt < DK / 8; ++nt) {
    float2* d = reinterpret_cast<float2*>(dst + nt * 8 + 2 * tq);
    float2 v = make_float2(p.scale * dq[nt][2 * r], p.scale * dq[nt][2 * r + 1]);
    if (accumulate) v.x += d->x, v.y += d->y;
    *d = v;
  }
}

template <int DK, int DV, Branch B>
__global__ void __launch_bounds__(kThreads)
    dense_dq_kernel(const NsaParams p, const RowTile* __restrict__ tiles, bool accumulate) {
  constexpr int KT = dq_key_tile<DK>();
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* ks = reinterpret_cast<bf16*>(smem);
  bf16* vs = ks + KT * tile_stride(DK);

  const RowTile tile = tiles[blockIdx.x];
  const int64_t h = blockIdx.y, g = h / p.hpg, n = tile.seq, start = p.cu_seqlens[n];
  const int warp = threadIdx.x >> 5, gid = (threadIdx.x & 31) >> 2, tq = threadIdx.x & 3;
  const int r_lo = warp * 16 + gid;
  const int64_t t0 = tile.first + r_lo, th_lo = (start + t0) * p.H + h, th_hi = th_lo + 8 * p.H;
  const int64_t H = p.H, row0 = start + tile.first + warp * 16, valid = tile.rows - warp * 16;
  const auto row_of = [=](const bf16* base, int d) {
    return
        [=](int r) -> const bf16* { return r < valid ? base + ((row0 + r) * H + h) * d : nullptr; };
  };
  uint32_t qf[DK / 16][4], dof[DV / 16][4];
  load_a_rows<DK>(qf, row_of(p.q, DK));
  load_a_rows<DV>(dof, row_of(p.d_o, DV));
  RowStats st;
  st.load(p, static_cast<int>(B), th_lo, th_hi, r_lo < tile.rows, r_lo + 8 < tile.rows);

  const KeyRange keys = dense_keys<B>(p, tile.first, tile.first + tile.rows - 1);
  const auto kv = [&] {
    if constexpr (B == Branch::kCmp) {
      return compressed_rows(p, n, g);
    } else {
      return raw_rows(p, static_cast<int>(B), n, g);
    }
  }();
  const float sl2 = p.scale * kLog2e;
  float dq[DK / 8][4] = {};
  for (int64_t k0 = keys.begin; k0 < keys.end; k0 += KT) {
    const int64_t nk = keys.end - k0 < KT ? keys.end - k0 : KT;
    __syncthreads();
    load_tile<DK>(
        ks, KT, [&](int i) { return i < nk ? kv.k + (k0 + i) * kv.k_stride : nullptr; },
        threadIdx.x, kThreads);
    load_tile<DV>(
        vs, KT, [&](int i) { return i < nk ? kv.v + (k0 + i) * kv.v_stride : nullptr; },
        threadIdx.x, kThreads);
    __syncthreads();
    float s[KT / 8][4] = {}, dp[KT / 8][4] = {};
    mma_a_bt<DK, KT / 8>(s, qf, ks);
    mma_a_bt<DV, KT / 8>(dp, dof, vs);
    scores_to_ds<KT / 8>(s, dp, st, sl2, [&](int nt, int e) {
      const int r = r_lo + (e >> 1) * 8;
      const int64_t j = k0 + nt * 8 + 2 * tq + (e & 1);
      return r < tile.rows && j < keys.end && key_visible<B>(p, t0 + (e >> 1) * 8, j);
    });
    mma_c_b<DK, KT / 16>(dq, s, ks);
  }
  if (r_lo < tile.rows) store_dq<DK>(p, dq, 0, th_lo, accumulate);
  if (r_lo + 8 < tile.rows) store_dq<DK>(p, dq, 1, th_hi, accumulate);
}

// Selected branch: warp w of CTA x serves query row 4x + w of group blockIdx.y; adds to d_q.
template <int DK, int DV>
__global__ void __launch_bounds__(kThreads) selected_dq_kernel(const NsaParams p) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gid = lane >> 2;
  bf16* ks = reinterpret_cast<bf16*>(smem) + warp * kSelChunk * (tile_stride(DK) + tile_stride(DV));
  bf16* vs = ks + kSelChunk * tile_stride(DK);
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarps + warp, g = blockIdx.y;
  if (row >= p.T) return;  // warp-uniform; this kernel has no CTA barrier
  const int64_t n = p.seq_of_row[row], t = row - p.cu_seqlens[n];
  const KvRows<bf16> kv = raw_rows(p, 1, n, g);
  const int32_t* blocks = p.sel_idx + (row * p.G + g) * p.n_sel;
  const float sl2 = p.scale * kLog2e;

  for (int64_t h0 = 0; h0 < p.hpg; h0 += 16) {
    const int64_t nh = p.hpg - h0 < 16 ? p.hpg - h0 : 16;
    const int64_t th0 = row * p.H + g * p.hpg + h0;
    uint32_t qf[DK / 16][4], dof[DV / 16][4];
    load_a_rows<DK>(qf,
                    [&](int r) -> const bf16* { return r < nh ? p.q + (th0 + r) * DK : nullptr; });
    load_a_rows<DV>(
        dof, [&](int r) -> const bf16* { return r < nh ? p.d_o + (th0 + r) * DV : nullptr; });
    RowStats st;
    st.load(p, 1, th0 + gid, th0 + gid + 8, gid < nh, gid + 8 < nh);
    float dq[DK / 8][4] = {};
    for (int64_t k = 0; k < p.n_sel; ++k) {
      const int64_t b = blocks[k];
      if (b < 0) break;
      const int64_t end = (b + 1) * p.l_sel < t + 1 ? (b + 1) * p.l_sel : t + 1;
      for (int64_t r0 = b * p.l_sel; r0 < end; r0 += kSelChunk) {
        const int64_t nk = end - r0 < kSelChunk ? end - r0 : kSelChunk;
        __syncwarp();
        load_tile<DK>(
            ks, kSelChunk, [&](int i) { return i < nk ? kv.k + (r0 + i) * kv.k_stride : nullptr; },
            lane, 32);
        load_tile<DV>(
            vs, kSelChunk, [&](int i) { return i < nk ? kv.v + (r0 + i) * kv.v_stride : nullptr; },
            lane, 32);
        __syncwarp();
        float s[kSelChunk / 8][4] = {}, dp[kSelChunk / 8][4] = {};
        mma_a_bt<DK, kSelChunk / 8>(s, qf, ks);
        mma_a_bt<DV, kSelChunk / 8>(dp, dof, vs);
        scores_to_ds<kSelChunk / 8>(
            s, dp, st, sl2, [&](int nt, int e) { return nt * 8 + 2 * (lane & 3) + (e & 1) < nk; });
        mma_c_b<DK, kSelChunk / 16>(dq, s, ks);
      }
    }
    if (gid < nh) store_dq<DK>(p, dq, 0, th0 + gid, true);
    if (gid + 8 < nh) store_dq<DK>(p, dq, 1, th0 + gid + 8, true);
  }
}

template <Branch B>
void launch_dense_dq(const NsaParams& p, const RowTile* tiles, int64_t n_tiles, bool accumulate,
                     cudaStream_t stream) {
  if (n_tiles == 0) return;
  dispatch_head_dims(p.dk, p.dv, [&](auto DK, auto DV) {
    const auto kernel = dense_dq_kernel<DK(), DV(), B>;
    const size_t smem =
        dq_key_tile<DK()>() * (tile_stride(DK()) + tile_stride(DV())) * sizeof(bf16);
    set_kernel_smem(kernel, smem);
    kernel<<<dim3(static_cast<unsigned>(n_tiles), static_cast<unsigned>(p.H)), kThreads, smem,
             stream>>>(p, tiles, accumulate);
    NSA_CUDA_LAUNCH_CHECK();
  });
}

}  // namespace

void launch_nsa_backward_preprocess(const NsaParams& p, cudaStream_t stream) {
  if (p.T == 0) return;
  const int64_t n = p.T * p.H;
  preprocess_kernel<<<static_cast<unsigned>((n + 255) / 256), 256, 0, stream>>>(p);
  NSA_CUDA_LAUNCH_CHECK();
}

void launch_nsa_backward_dq(const NsaParams& p, const RowTile* tiles, int64_t n_tiles,
                            cudaStream_t stream) {
  if (p.T == 0) return;
  launch_dense_dq<Branch::kCmp>(p, tiles, n_tiles, false, stream);
  dispatch_head_dims(p.dk, p.dv, [&](auto DK, auto DV) {
    const auto kernel = selected_dq_kernel<DK(), DV()>;
    const size_t smem = kWarps * kSelChunk * (tile_stride(DK()) + tile_stride(DV())) * sizeof(bf16);
    set_kernel_smem(kernel, smem);
    const unsigned rows = static_cast<unsigned>((p.T + kWarps - 1) / kWarps);
    kernel<<<dim3(rows, static_cast<unsigned>(p.G)), kThreads, smem, stream>>>(p);
    NSA_CUDA_LAUNCH_CHECK();
  });
  launch_dense_dq<Branch::kWin>(p, tiles, n_tiles, true, stream);
}

}  // namespace nsa::cuda
