// NSA forward attention on tensor cores (v2): the compressed and window branches as flash-style
// tiles, the selected branch group-centric, and the gated combination.
//
// Dense branches (compressed, window): a CTA owns 64 query rows of one head (4 warps × 16 rows,
// one warpgroup) and walks the branch's key range in tiles staged in shared memory: S = Q·Kᵀ on
// tensor cores, the online softmax in registers (the exp2 domain), O += P·V with P never leaving
// registers. Head dims that are multiples of 64 use warpgroup MMA (wgmma_tiles.cuh: K/V read once
// per warpgroup from swizzled tiles instead of once per warp), smaller ones mma.sync. Rows that
// see no key get o = 0 and lse = −inf.
// Selected branch: a warp owns R query rows of one group, its M = 16 rows are their heads (all
// heads share every loaded K/V block, as in the paper's kernel; see sel_pack.cuh); it walks the
// union of the rows' chosen blocks in chunks of 32 rows staged in the warp's own shared memory.
// The window kernel runs last and writes o = Σ_c g_c·o_c from the bf16 branch outputs.
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
constexpr int kKeyTile = 64;  // key rows per shared tile (dense branches)

// Writes one row half of a warp's result: o_branch (bf16) and lse; with `combine`, also
// o = g_cmp·o_cmp + g_sel·o_sel + g_win·(this) (the window branch when p.o is set; otherwise the
// block-major selected branch's merge combines, sel_block_major.cu).
template <int DV>
__device__ void store_row(const NsaParams& p, const SoftmaxAcc<DV>& acc, int r, int64_t th,
                          int branch, bool combine) {
  const int tq = threadIdx.x & 3;
  const float inv = acc.inv(r);
  bf16* ob = p.o_branch[branch] + th * DV;
  float gates[3];
  if (combine) {
    for (int c = 0; c < 3; ++c) gates[c] = __bfloat162float(p.gate[c][th]);
  }
#pragma unroll
  for (int nt = 0; nt < DV / 8; ++nt) {
    const int col = nt * 8 + 2 * tq;
    const float x0 = acc.o[nt][2 * r] * inv, x1 = acc.o[nt][2 * r + 1] * inv;
    *reinterpret_cast<__nv_bfloat162*>(ob + col) = __floats2bfloat162_rn(x0, x1);
    if (combine) {
      const __nv_bfloat162 c0 =
          *reinterpret_cast<const __nv_bfloat162*>(p.o_branch[0] + th * DV + col);
      const __nv_bfloat162 c1 =
          *reinterpret_cast<const __nv_bfloat162*>(p.o_branch[1] + th * DV + col);
      const float y0 = gates[0] * __low2float(c0) + gates[1] * __low2float(c1) + gates[2] * x0;
      const float y1 = gates[0] * __high2float(c0) + gates[1] * __high2float(c1) + gates[2] * x1;
      *reinterpret_cast<__nv_bfloat162*>(p.o + th * DV + col) = __floats2bfloat162_rn(y0, y1);
    }
  }
  if (tq == 0) p.lse[branch][th] = acc.lse(r);
}

// The dense-branch tile loop on warpgroup MMA (kWgmma: swizzled tiles, wgmma.mma_async) or on
// mma.sync (head dims below 64: padded tiles, ldmatrix). With wgmma a CTA runs HC warpgroups, one
// per head of a group, on the same query rows: each K/V tile is loaded once for HC heads (the
// kernels are bound by these loads from L2, not by the MMAs).
template <int DK, int DV, bool kWgmma>
struct DenseTiling {
  static constexpr int HC = kWgmma ? 2 : 1;  // heads per CTA when the group's heads divide by it
  static constexpr int KT = kWgmma ? 64 : kKeyTile;
  static size_t smem_bytes() {
    if constexpr (kWgmma) return TmaKvPipeline<DK, DV, KT, int>::kBytes;
    return KvPipeline<DK, DV, KT, false, int>::kBytes;
  }
};

template <int DK, int DV, Branch B, bool kWgmma, int HC>
__global__ void __launch_bounds__(kThreads* HC, wgmma_min_ctas<DK, HC>())
    dense_forward_kernel(const NsaParams p, const RowTile* __restrict__ tiles,
                         const __grid_constant__ DenseKvMaps maps) {
  constexpr int KT = DenseTiling<DK, DV, kWgmma>::KT;
  extern __shared__ __align__(16) unsigned char smem[];
  // Later rows see more keys: the grid takes the tiles last to first, so the longest start first.
  const RowTile tile = tiles[gridDim.x - 1 - blockIdx.x];
  if (tile.rows == 0) return;  // padding of a device-built table (device_layout.h)
  const int64_t h = blockIdx.y * HC + threadIdx.x / kThreads, g = h / p.hpg, n = tile.seq;
  const int64_t start = p.cu_seqlens[n];
  const int warp = (threadIdx.x >> 5) % kWarps, gid = (threadIdx.x & 31) >> 2;
  const int r_lo = warp * 16 + gid;  // this thread's rows in the tile: r_lo and r_lo + 8
  const int warp_t0 = static_cast<int>(tile.first) + warp * 16, warp_rows = tile.rows - warp * 16;

  uint32_t qf[DK / 16][4];
  load_a_rows<DK>(qf, [&](int r) -> const bf16* {
    return r < warp_rows ? p.q + ((start + warp_t0 + r) * p.H + h) * DK : nullptr;
  });
  const KeyRange keys = dense_keys<B>(p, tile.first, tile.first + tile.rows - 1);
  const auto pipe = dense_pipeline<DK, DV, KT, kWgmma, kThreads * HC, B>(smem, p, maps, n, g, keys);
  const int64_t n_chunks = n_key_chunks(keys, KT);
  const MaskParams m = mask_params(p);
  const float sl2 = p.scale * kLog2e;
  SoftmaxAcc<DV> acc;
  acc.init();
  pipe.start(n_chunks);
  for (int64_t it = 0; it < n_chunks; ++it) {
    float s[KT / 8][4];
    KeyChunk c;
    if constexpr (kWgmma) {
      c = pipe.acquire(it);
      wgmma_fence();
      wgmma_a_bt_issue<DK, KT>(s, qf, pipe.k(it));
      wgmma_commit();
      pipe.prefetch(it, n_chunks);  // the next chunk loads while S, the softmax and P·V run
      wgmma_wait<0>();
    } else {
      c = pipe.acquire(it, n_chunks);
#pragma unroll
      for (int nt = 0; nt < KT / 8; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
      mma_a_bt<DK, KT / 8>(s, qf, pipe.k(it));
    }
    scale_and_mask<B, KT / 8>(s, m, warp_t0, warp_rows, static_cast<int>(c.k0),
                              static_cast<int>(c.nk), sl2);
    acc.template update<KT / 8>(s);
    if constexpr (kWgmma) {
      wgmma_p_v<DV, KT>(acc.o, s, pipe.v(it));
    } else {
      mma_c_b<DV, KT / 16>(acc.o, s, pipe.v(it));
      pipe.release();
    }
  }
  acc.finish();
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (r_lo + 8 * r < tile.rows) {
      store_row<DV>(p, acc, r, (start + tile.first + r_lo + 8 * r) * p.H + h, static_cast<int>(B),
                    B == Branch::kWin && p.o != nullptr);
    }
  }
}

// Selected branch: warp w of CTA x serves rows [(4x + w)·R, +R) of group blockIdx.y, packed as in
// sel_pack.cuh (one pass per sequence the rows touch).
template <int DK, int DV>
__global__ void __launch_bounds__(kThreads) selected_forward_kernel(const NsaParams p, int R) {
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
      uint32_t qf[DK / 16][4];
      load_pack_rows<DK>(qf, p, pack, h0, p.q);
      SoftmaxAcc<DV> acc;
      acc.init();
      pipe.start(n_chunks);
      for (int64_t it = 0; it < n_chunks; ++it) {
        const KeyChunk c = pipe.acquire(it, n_chunks);
        if (c.nk > 0) {
          float s[kSelChunkRows / 8][4] = {};
          mma_a_bt<DK, kSelChunkRows / 8>(s, qf, pipe.k(it));
          rm.template apply<kSelChunkRows / 8>(s, p, pack, it, c, sl2);
          acc.template update<kSelChunkRows / 8>(s);
          mma_c_b<DV, kSelChunkRows / 16>(acc.o, s, pipe.v(it));
        }
        pipe.release();
      }
      acc.finish();
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int64_t th = pack.th(p, gid + 8 * r, h0);
        if (th >= 0) store_row<DV>(p, acc, r, th, 1, false);
      }
    }
  }
}

template <Branch B>
void launch_dense(const NsaParams& p, const RowTile* tiles, int64_t n_tiles, cudaStream_t stream) {
  if (n_tiles == 0) return;
  dispatch_head_dims(p.dk, p.dv, [&](auto DK, auto DV) {
    constexpr bool kWgmma = wgmma_dims(DK(), DV());
    using Tiling = DenseTiling<DK(), DV(), kWgmma>;
    DenseKvMaps maps{};
    if constexpr (kWgmma) maps = make_dense_kv_maps(p, Tiling::KT);
    const auto launch = [&](auto hc) {
      constexpr int HC = decltype(hc)::value;
      const auto kernel = dense_forward_kernel<DK(), DV(), B, kWgmma, HC>;
      set_kernel_smem(kernel, Tiling::smem_bytes());
      kernel<<<dim3(static_cast<unsigned>(n_tiles), static_cast<unsigned>(p.H / HC)), kThreads * HC,
               Tiling::smem_bytes(), stream>>>(p, tiles, maps);
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

void launch_compressed_forward(const NsaParams& p, const RowTile* tiles, int64_t n_tiles,
                               cudaStream_t stream) {
  launch_dense<Branch::kCmp>(p, tiles, n_tiles, stream);
}

void launch_window_forward(const NsaParams& p, const RowTile* tiles, int64_t n_tiles,
                           cudaStream_t stream) {
  launch_dense<Branch::kWin>(p, tiles, n_tiles, stream);
}

void launch_selected_forward(const NsaParams& p, cudaStream_t stream) {
  if (p.T == 0) return;
  dispatch_head_dims(p.dk, p.dv, [&](auto DK, auto DV) {
    const auto kernel = selected_forward_kernel<DK(), DV()>;
    const int R = sel_rows_per_warp(p.hpg, p.n_sel);
    const size_t smem = kWarps * (KvPipeline<DK(), DV(), kSelChunkRows, true, int>::kBytes +
                                  sel_union_bytes(p.hpg, p.n_sel));
    set_kernel_smem(kernel, smem);
    const unsigned ctas = static_cast<unsigned>((p.T + kWarps * R - 1) / (kWarps * R));
    kernel<<<dim3(ctas, static_cast<unsigned>(p.G)), kThreads, smem, stream>>>(p, R);
    NSA_CUDA_LAUNCH_CHECK();
  });
}

}  // namespace nsa::cuda
