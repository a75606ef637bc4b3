// NSA backward on tensor cores (v2), part 1: the per-(row, head) preprocessing and dq.
//
// preprocess: d_gate_c = dO·o_c and delta_c = g_c·(dO·o_c) (= dO_c·o_c, the softmax-backward
// correction of branch c), one thread per (row, head).
// dq: the forward's tiling again – dense branches per (64 query rows, head) over key tiles in
// shared memory (warpgroup MMA for head dims that are multiples of 64, see wgmma_tiles.cuh), the
// selected branch per (query row, group) with the heads as M – recomputing P = exp(S − lse) from
// the saved log-sum-exp: dS = P ∘ (g_c·dO·Vᵀ − delta_c), dq += scale·dS·K. The compressed and
// window branches run in one kernel (Q and dO loaded once, dq summed in registers over both key
// ranges and written once), then the selected branch adds: fixed order, no atomics, so dq is
// bit-identical from run to run. (The single-branch kernels stay for the kernel workshop.)
#include <type_traits>

#include "common/cuda_check.h"
#include "head_dims.h"
#include "nsa_kernels.h"
#include "sel_pack.cuh"
#include "softmax.cuh"
#include "tiles.cuh"
#include "wgmma_tiles.cuh"

namespace nsa::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
static_assert(kQueryTileRows == 16 * kWarps, "one warp per 16 query rows");

// Key rows per shared tile: 32 for the widest heads keeps dq, Q, dO, S and dP in registers.
template <int DK>
constexpr int dq_key_tile() {
  return DK > 128 ? 32 : 64;
}

// One warp per (row, head): bf16 pairs along the channels, then a warp sum.
__global__ void preprocess_kernel(const NsaParams p) {
  const int64_t th = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x & 31;
  if (th >= p.T * p.H) return;  // warp-uniform
  const auto* d_o = reinterpret_cast<const __nv_bfloat162*>(p.d_o + th * p.dv);
  float acc[3] = {0.0f, 0.0f, 0.0f};
  for (int64_t e = lane; e < p.dv / 2; e += 32) {
    const float2 x = __bfloat1622float2(d_o[e]);
    for (int c = 0; c < 3; ++c) {
      const float2 y =
          __bfloat1622float2(reinterpret_cast<const __nv_bfloat162*>(p.o_branch[c] + th * p.dv)[e]);
      acc[c] += x.x * y.x + x.y * y.y;
    }
  }
  for (int c = 0; c < 3; ++c) {
    for (int o = 16; o > 0; o >>= 1) acc[c] += __shfl_xor_sync(0xffffffffu, acc[c], o);
  }
  if (lane == 0) {
    for (int c = 0; c < 3; ++c) {
      if (p.d_gate[c]) p.d_gate[c][th] = acc[c];
      if (p.d_gate_bf16[c]) p.d_gate_bf16[c][th] = __float2bfloat16_rn(acc[c]);
      p.delta[c][th] = __bfloat162float(p.gate[c][th]) * acc[c];
    }
  }
}

// d_q[th] (=, or +=) scale·dq for one row half; also into p.d_q_bf16 when the caller set it (the
// launch of the kernel that finishes d_q).
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
    if (p.d_q_bf16) {
      *reinterpret_cast<__nv_bfloat162*>(p.d_q_bf16 + th * DK + nt * 8 + 2 * tq) =
          __floats2bfloat162_rn(v.x, v.y);
    }
  }
}

// Dense-branch dq on warpgroup MMA (head dims multiples of 64, HC warpgroups per CTA on HC heads
// of a group sharing each K/V tile, as in the forward) or on mma.sync (smaller heads).
template <int DK, int DV, bool kWgmma>
struct DqTiling {
  static constexpr int HC = kWgmma ? 2 : 1;
  static constexpr int KT = kWgmma ? 64 : dq_key_tile<DK>();
  // wgmma: each warpgroup's Q and dO rows (64 × DK, 64 × DV) as swizzled tiles after the pipeline.
  static constexpr size_t kRowTileBytes = 64 * (DK + DV) * 2;
  static size_t smem_bytes() {
    if constexpr (kWgmma) return TmaKvPipeline<DK, DV, KT, int>::kBytes + HC * kRowTileBytes;
    return KvPipeline<DK, DV, KT, false, int>::kBytes;
  }
};

// Bs: the dense branches whose dq this kernel sums, in order (compressed, then window: the
// fused kernel; or one of them). Q and dO are loaded once for all of them and d_q is written once.
template <int DK, int DV, bool kWgmma, int HC, Branch... Bs>
__global__ void __launch_bounds__(kThreads* HC, wgmma_min_ctas<DK, HC>())
    dense_dq_kernel(const NsaParams p, const RowTile* __restrict__ tiles, bool accumulate,
                    const __grid_constant__ DenseKvMaps maps) {
  constexpr int KT = DqTiling<DK, DV, kWgmma>::KT;
  extern __shared__ __align__(16) unsigned char smem[];
  // Later rows see more keys: the grid takes the tiles last to first, so the longest start first.
  const RowTile tile = tiles[gridDim.x - 1 - blockIdx.x];
  if (tile.rows == 0) return;  // padding of a device-built table (device_layout.h)
  const int64_t h = blockIdx.y * HC + threadIdx.x / kThreads, g = h / p.hpg, n = tile.seq;
  const int64_t start = p.cu_seqlens[n];
  const int warp = (threadIdx.x >> 5) % kWarps, gid = (threadIdx.x & 31) >> 2;
  const int r_lo = warp * 16 + gid;
  const int warp_t0 = static_cast<int>(tile.first) + warp * 16, warp_rows = tile.rows - warp * 16;
  const int64_t th_lo = (start + tile.first + r_lo) * p.H + h, th_hi = th_lo + 8 * p.H;
  const int64_t H = p.H, row0 = start + warp_t0;
  const auto row_of = [=](const bf16* base, int d) {
    return [=](int r) -> const bf16* {
      return r < warp_rows ? base + ((row0 + r) * H + h) * d : nullptr;
    };
  };
  // Q and dO: fragments in registers (mma.sync), or this warpgroup's shared tiles (wgmma, loaded
  // with the first K/V chunk of the first branch that has one).
  constexpr int kQf = kWgmma ? 1 : DK / 16, kDof = kWgmma ? 1 : DV / 16;
  uint32_t qf[kQf][4], dof[kDof][4];
  unsigned char* const q_tile = sw_align(smem) +
                                (TmaKvPipeline<DK, DV, KT, int>::kBytes - kSwAlignSlack) +
                                (threadIdx.x / kThreads) * DqTiling<DK, DV, kWgmma>::kRowTileBytes;
  unsigned char* const do_tile = q_tile + 64 * DK * 2;
  if constexpr (!kWgmma) {
    load_a_rows<DK>(qf, row_of(p.q, DK));
    load_a_rows<DV>(dof, row_of(p.d_o, DV));
  }
  bool rows_loaded = false;  // wgmma: the Q / dO tiles are in shared memory
  const MaskParams m = mask_params(p);
  const float sl2 = p.scale * kLog2e;
  float dq[DK / 8][4] = {};
  const auto run_branch = [&](auto branch) {
    constexpr Branch B = decltype(branch)::value;
    RowStats st;
    st.load(p, static_cast<int>(B), th_lo, th_hi, r_lo < tile.rows, r_lo + 8 < tile.rows);
    const KeyRange keys = dense_keys<B>(p, tile.first, tile.first + tile.rows - 1);
    const auto pipe =
        dense_pipeline<DK, DV, KT, kWgmma, kThreads * HC, B>(smem, p, maps, n, g, keys);
    const int64_t n_chunks = n_key_chunks(keys, KT);
    pipe.start(n_chunks);
    if constexpr (kWgmma) {
      if (n_chunks > 0 && !rows_loaded) {
        const int wg_tid = threadIdx.x % kThreads;
        const int64_t wg_row0 = start + tile.first;
        const auto rows = [&](const bf16* base, int d) {
          return [=](int r) -> const bf16* {
            return r < tile.rows ? base + ((wg_row0 + r) * H + h) * d : nullptr;
          };
        };
        load_sw_tile<DK, 64, kThreads>(q_tile, rows(p.q, DK), wg_tid);
        load_sw_tile<DV, 64, kThreads>(do_tile, rows(p.d_o, DV), wg_tid);
        cp_async_commit();
        cp_async_wait<0>();
        fence_proxy_async_smem();  // written by cp.async, read by wgmma
        __syncthreads();
        rows_loaded = true;
      }
    }
    for (int64_t it = 0; it < n_chunks; ++it) {
      const KeyChunk c = pipe.acquire(it, n_chunks);
      float s[KT / 8][4], dp[KT / 8][4];
      if constexpr (kWgmma) {
        wgmma_fence();
        wgmma_tile_bt_issue<DK, KT>(s, q_tile, pipe.k(it));
        wgmma_tile_bt_issue<DV, KT>(dp, do_tile, pipe.v(it));
        wgmma_commit();
        wgmma_wait<0>();
      } else {
#pragma unroll
        for (int nt = 0; nt < KT / 8; ++nt) {
#pragma unroll
          for (int e = 0; e < 4; ++e) s[nt][e] = dp[nt][e] = 0.0f;
        }
        mma_a_bt<DK, KT / 8>(s, qf, pipe.k(it));
        mma_a_bt<DV, KT / 8>(dp, dof, pipe.v(it));
      }
      scale_and_mask<B, KT / 8>(s, m, warp_t0, warp_rows, static_cast<int>(c.k0),
                                static_cast<int>(c.nk), sl2);
      scores_to_ds<KT / 8>(s, dp, st);
      if constexpr (kWgmma) {
        wgmma_p_v<DK, KT>(dq, s, pipe.k(it));
      } else {
        mma_c_b<DK, KT / 16>(dq, s, pipe.k(it));
      }
      pipe.release();  // ends with a barrier: the next branch may refill the stages
    }
  };
  (run_branch(std::integral_constant<Branch, Bs>{}), ...);
  if (r_lo < tile.rows) store_dq<DK>(p, dq, 0, th_lo, accumulate);
  if (r_lo + 8 < tile.rows) store_dq<DK>(p, dq, 1, th_hi, accumulate);
}

// Selected branch: warp w of CTA x serves rows [(4x + w)·R, +R) of group blockIdx.y, packed as in
// sel_pack.cuh; adds to d_q.
template <int DK, int DV>
__global__ void __launch_bounds__(kThreads) selected_dq_kernel(const NsaParams p, int R) {
  using Pipe = KvPipeline<DK, DV, kSelChunkRows, true, SelectedChunks>;
  extern __shared__ __align__(16) unsigned char smem[];
  const int gid = (threadIdx.x & 31) >> 2;
  const float sl2 = p.scale * kLog2e;
  SelPasses passes(p, R, kWarps, smem + kWarps * Pipe::kBytes);
  for (SelPack pack; passes.next(p, pack);) {
    const int64_t n_chunks = pack.n_chunks(p);
    const Pipe pipe = sel_pipeline<DK, DV>(p, pack, smem);
    for (int64_t h0 = 0; h0 < p.hpg; h0 += 16) {
      const SelRowMask rm(p, pack, h0);
      const int64_t th_lo = pack.th(p, gid, h0), th_hi = pack.th(p, gid + 8, h0);
      uint32_t qf[DK / 16][4], dof[DV / 16][4];
      load_pack_rows<DK>(qf, p, pack, h0, p.q);
      load_pack_rows<DV>(dof, p, pack, h0, p.d_o);
      RowStats st;
      st.load(p, 1, th_lo, th_hi, th_lo >= 0, th_hi >= 0);
      float dq[DK / 8][4] = {};
      pipe.start(n_chunks);
      for (int64_t it = 0; it < n_chunks; ++it) {
        const KeyChunk c = pipe.acquire(it, n_chunks);
        if (c.nk > 0) {
          float s[kSelChunkRows / 8][4] = {}, dp[kSelChunkRows / 8][4] = {};
          mma_a_bt<DK, kSelChunkRows / 8>(s, qf, pipe.k(it));
          mma_a_bt<DV, kSelChunkRows / 8>(dp, dof, pipe.v(it));
          rm.template apply<kSelChunkRows / 8>(s, p, pack, it, c, sl2);
          scores_to_ds<kSelChunkRows / 8>(s, dp, st);
          mma_c_b<DK, kSelChunkRows / 16>(dq, s, pipe.k(it));
        }
        pipe.release();
      }
      if (th_lo >= 0) store_dq<DK>(p, dq, 0, th_lo, true);
      if (th_hi >= 0) store_dq<DK>(p, dq, 1, th_hi, true);
    }
  }
}

template <Branch... Bs>
void launch_dense_dq(const NsaParams& p, const RowTile* tiles, int64_t n_tiles, bool accumulate,
                     cudaStream_t stream) {
  if (n_tiles == 0) return;
  dispatch_head_dims(p.dk, p.dv, [&](auto DK, auto DV) {
    constexpr bool kWgmma = wgmma_dims(DK(), DV());
    using Tiling = DqTiling<DK(), DV(), kWgmma>;
    DenseKvMaps maps{};
    if constexpr (kWgmma) maps = make_dense_kv_maps(p, Tiling::KT);
    const auto launch = [&](auto hc) {
      constexpr int HC = decltype(hc)::value;
      const auto kernel = dense_dq_kernel<DK(), DV(), kWgmma, HC, Bs...>;
      set_kernel_smem(kernel, Tiling::smem_bytes());
      kernel<<<dim3(static_cast<unsigned>(n_tiles), static_cast<unsigned>(p.H / HC)), kThreads * HC,
               Tiling::smem_bytes(), stream>>>(p, tiles, accumulate, maps);
      NSA_CUDA_LAUNCH_CHECK();
    };
    if (p.hpg % Tiling::HC == 0) {
      launch(Dim<Tiling::HC>{});
    } else {
      launch(Dim<1>{});
    }
  });
}

}  // namespace

void launch_nsa_backward_preprocess(const NsaParams& p, cudaStream_t stream) {
  if (p.T == 0) return;
  const int64_t warps = p.T * p.H;  // dv is even for every built head size
  preprocess_kernel<<<static_cast<unsigned>((warps + 7) / 8), 256, 0, stream>>>(p);
  NSA_CUDA_LAUNCH_CHECK();
}

void launch_compressed_dq(const NsaParams& p, const RowTile* tiles, int64_t n_tiles,
                          cudaStream_t stream) {
  launch_dense_dq<Branch::kCmp>(p, tiles, n_tiles, false, stream);
}

void launch_selected_dq(const NsaParams& p, cudaStream_t stream) {
  if (p.T == 0) return;
  dispatch_head_dims(p.dk, p.dv, [&](auto DK, auto DV) {
    const auto kernel = selected_dq_kernel<DK(), DV()>;
    const int R = sel_rows_per_warp(p.hpg, p.n_sel);
    const size_t smem = kWarps * (KvPipeline<DK(), DV(), kSelChunkRows, true, int>::kBytes +
                                  sel_union_bytes(p.hpg, p.n_sel));
    set_kernel_smem(kernel, smem);
    const unsigned ctas = static_cast<unsigned>((p.T + kWarps * R - 1) / (kWarps * R));
    kernel<<<dim3(ctas, static_cast<unsigned>(p.G)), kThreads, smem, stream>>>(p, R);
    NSA_CUDA_LAUNCH_CHECK();
  });
}

void launch_window_dq(const NsaParams& p, const RowTile* tiles, int64_t n_tiles,
                      cudaStream_t stream) {
  launch_dense_dq<Branch::kWin>(p, tiles, n_tiles, true, stream);
}

void launch_compressed_and_window_dq(const NsaParams& p, const RowTile* tiles, int64_t n_tiles,
                                     cudaStream_t stream) {
  launch_dense_dq<Branch::kCmp, Branch::kWin>(p, tiles, n_tiles, false, stream);
}

}  // namespace nsa::cuda
