// Block selection on tensor cores: importance scores fused with a running top-n, so the
// S × S/d probability matrix (and the S × S/l_sel score matrix) never exists.
//
// A CTA owns 64 query rows of one group (4 warps × 16 rows) and walks the compressed keys in tiles
// of 64. Per tile it recomputes every head's compressed-branch probabilities from the saved
// log-sum-exp (S = Q·Kᵀ on tensor cores, p = exp(s − lse)) and sums them over the group's heads in
// ascending head order, into a shared strip that keeps the last `halo` tokens of the previous tile.
// Every selection block whose tokens are all in the strip then gets its score – the sum over its
// overlapping tokens in ascending order, p·overlap/l, exactly as the CPU accumulates it – and one
// thread per query row inserts it into that row's top list with the (score desc, index asc) rule.
// After the last tile the forced blocks (0, c−1, c) join, the set is sorted and written.
#include <type_traits>

#include "common/cuda_check.h"
#include "device.h"
#include "head_dims.h"
#include "nsa_kernels.h"
#include "tiles.cuh"
#include "wgmma_tiles.cuh"

namespace nsa::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kRows = kQueryTileRows;  // query rows per CTA (one warp per 16)
constexpr int kKeyTile = 64;           // compressed tokens per tile

// The group's Q rows of a CTA staged once in shared memory and read by ldmatrix per head and tile,
// instead of loaded from global memory per head and tile: for mma.sync (dk <= 64 here) when they
// fit kQSmemMax and the grid is short (at most kQSharedCtasPerSm CTAs per SM). The extra shared
// memory costs CTAs per SM (4 -> 2 at m7c_125m, select_min_ctas): worth it when the longest CTAs
// bound the kernel, not when many waves do. Measured (H100 workshop, m7c_125m, against the reloads
// at 3 CTAs per SM): 8k 0.137 -> 0.119 ms, 16k 0.259 -> 0.235, 64k 2.48 -> 2.59 (so 64k keeps the
// reloads); loading the next head's rows while this one's products run instead cost 224
// registers and was slower everywhere (16k 0.286, 64k 3.43).
constexpr int64_t kQSmemMax = 64 * 1024;
constexpr int64_t kQSharedCtasPerSm = 4;

struct SelectSmem {
  int64_t ks, strip, lse2, top_s, top_i, top_n, merged, q, total;
};

// Byte offsets: two K tiles (bf16, double-buffered), probability strip, per-head lse (log2), the
// two top lists of each row (scores, indices, lengths) and the merged list.
__host__ __device__ inline SelectSmem select_smem(int dk, int64_t hpg, int64_t n_sel, int halo,
                                                  bool q_shared) {
  SelectSmem s;
  s.ks = 0;
  s.strip = s.ks + 2 * kKeyTile * tile_stride(dk) * 2;
  s.lse2 = s.strip + kRows * (halo + kKeyTile) * 4;
  s.top_s = s.lse2 + hpg * kRows * 4;
  s.top_i = s.top_s + 2 * kRows * n_sel * 4;
  s.top_n = s.top_i + 2 * kRows * n_sel * 4;
  // The merged lists are written after the tile loop: they take the dead K tiles, strip and lse
  // where they fit (a fourth CTA per SM at m7c_125m).
  const int64_t merged_bytes = kRows * n_sel * 4;
  s.merged = merged_bytes <= s.top_s ? 0 : s.top_n + 2 * kRows * 4;
  s.q = s.top_n + 2 * kRows * 4 + (s.merged == 0 ? 0 : merged_bytes);
  s.total = s.q + (q_shared ? hpg * kRows * tile_stride(dk) * 2 : 0);
  return s;
}

// Tokens a selection block may need from before the current tile (see the file comment).
inline int strip_halo(const NsaParams& p) {
  return static_cast<int>((p.l_sel + p.l) / p.d + 1);
}

// A thread's best kRegTopMax candidates in registers, sorted by (score desc, index asc); empty
// slots hold (-inf, kNoBlock). Inserting is a fixed set of compares and selects (no memory, no
// data-dependent loop): the list in shared memory, shifted one entry per dependent load, was the
// kernel's hottest code (Nsight Compute source counters). Used when every row's list fits
// (n_sel - 1 <= kRegTopMax) and the head dimension leaves the registers (dk <= 128).
constexpr int kRegTopMax = 16;
constexpr int32_t kNoBlock = 0x7fffffff;
struct RegTop {
  float s[kRegTopMax];
  int32_t i[kRegTopMax];
  __device__ void init() {
#pragma unroll
    for (int k = 0; k < kRegTopMax; ++k) s[k] = -INFINITY, i[k] = kNoBlock;
  }
  // The new entry's rank is the count of entries that stay ahead of it; every slot then takes its
  // own, its predecessor's or the new value – independent selects, not a chain through the list.
  __device__ void insert(float cs, int32_t ci) {
    int pos = 0;
#pragma unroll
    for (int k = 0; k < kRegTopMax; ++k) pos += s[k] > cs || (s[k] == cs && i[k] < ci);
#pragma unroll
    for (int k = kRegTopMax - 1; k > 0; --k) {
      s[k] = k < pos ? s[k] : (k == pos ? cs : s[k - 1]);
      i[k] = k < pos ? i[k] : (k == pos ? ci : i[k - 1]);
    }
    if (pos == 0) s[0] = cs, i[0] = ci;
  }
};

// Head dims 128 and 192 score on warpgroup MMA: the K tiles swizzled (from a 1024-aligned base,
// kSwAlignSlack more bytes), S = Q·Kᵀ read once per warpgroup instead of once per warp by
// ldmatrix. Measured (H100 workshop): paper_attn 16k 1.891 -> 1.741 ms; at dk = 64 no gain
// (m7c_125m 16k 0.269 -> 0.265, 64k 2.753 -> 2.812: the top lists bound it), so 64 stays on
// mma.sync.
constexpr bool select_wgmma(int dk) {
  return dk % 64 == 0 && dk > 64;
}

bool select_q_shared(SelectQ q, int dk, int64_t hpg, int64_t ctas) {
  if (q == SelectQ::kGlobal || select_wgmma(dk) || hpg * kRows * tile_stride(dk) * 2 > kQSmemMax)
    return false;
  if (q == SelectQ::kShared) return true;
  return ctas <= kQSharedCtasPerSm * current_sm_count();
}

// CTAs per SM the register cap aims for: four on the long grids of heads up to 64 (Q reloaded,
// register top lists), where three were limited by registers (160) and shared memory alike; with
// the scores of half a key tile at a time and the merged lists in the dead K tiles, 128 registers
// and no spills. Measured (H100 workshop, m7c_125m): 32k 0.744 -> 0.629 ms, 64k 2.470 -> 2.187.
template <int DK, bool kRegTop, bool kQShared>
constexpr int select_min_ctas() {
  return DK <= 64 && kRegTop && !kQShared ? 4 : 1;
}

template <int DK, bool kRegTop, bool kQShared>
__global__ void __launch_bounds__(kThreads, select_min_ctas<DK, kRegTop, kQShared>())
    select_blocks_kernel(const NsaParams p, const RowTile* __restrict__ tiles, int halo) {
  constexpr bool kWgmma = select_wgmma(DK);
  extern __shared__ __align__(16) unsigned char smem_raw[];
  unsigned char* smem = kWgmma ? sw_align(smem_raw) : smem_raw;
  const SelectSmem L = select_smem(DK, p.hpg, p.n_sel, halo, kQShared);
  bf16* ks = reinterpret_cast<bf16*>(smem + L.ks);
  float* strip = reinterpret_cast<float*>(smem + L.strip);
  float* lse2 = reinterpret_cast<float*>(smem + L.lse2);
  float* top_s = reinterpret_cast<float*>(smem + L.top_s);
  int32_t* top_i = reinterpret_cast<int32_t*>(smem + L.top_i);
  int32_t* top_n = reinterpret_cast<int32_t*>(smem + L.top_n);
  int32_t* merged = reinterpret_cast<int32_t*>(smem + L.merged);
  bf16* qs = reinterpret_cast<bf16*>(smem + L.q);
  const int width = halo + kKeyTile;

  // Later rows see more keys: the grid takes the tiles last to first, so the longest start first.
  const RowTile tile = tiles[gridDim.x - 1 - blockIdx.x];
  if (tile.rows == 0) return;  // padding of a device-built table (device_layout.h)
  const int64_t g = blockIdx.y, n = tile.seq, start = p.cu_seqlens[n], hpg = p.hpg;
  const int warp = threadIdx.x >> 5, gid = (threadIdx.x & 31) >> 2, tq = threadIdx.x & 3;
  const int r_lo = warp * 16 + gid;

  for (int i = threadIdx.x; i < hpg * kRows; i += kThreads) {
    const int64_t hh = i / kRows, r = i % kRows;
    lse2[i] = r < tile.rows ? p.lse[0][(start + tile.first + r) * p.H + g * hpg + hh] * kLog2e
                            : -INFINITY;
  }
  for (int i = threadIdx.x; i < kRows * width; i += kThreads) strip[i] = 0.0f;

  const int64_t last = tile.first + tile.rows - 1;
  const KeyRange keys = dense_keys<Branch::kCmp>(p, tile.first, last);
  const KvRows kv = compressed_rows(p, n, g);
  const MaskParams m = mask_params(p);
  const float sl2 = p.scale * kLog2e, inv_l = 1.0f / static_cast<float>(p.l);

  // Two threads score each row: thread r (< 64) the even blocks, thread 64 + r the odd ones, each
  // into its own top list under the (score desc, index asc) rule; the lists are merged at the end
  // (the top n of a union is the top n of the two lists' union). Positions within a sequence fit
  // in 32 bits: the scoring loop runs in int.
  const int my_row = threadIdx.x % kRows, half = threadIdx.x / kRows;
  static_assert(kThreads == 2 * kRows, "two scoring threads per row");
  const int my_t = static_cast<int>(tile.first) + my_row;
  const bool has_row = my_row < tile.rows;
  const int l_sel = static_cast<int>(p.l_sel), d = static_cast<int>(p.d), l = static_cast<int>(p.l);
  const int my_c = my_t / l_sel, my_nv = static_cast<int>(num_visible(p, my_t));
  // When d divides l_sel and l, block j overlaps tokens j·per − lead .. j·per + per − 1 with
  // overlaps that do not depend on j (each > 0 as l >= d): the scoring loop needs no division.
  const bool periodic = l_sel % d == 0 && l % d == 0;
  const int per = l_sel / d, lead = l / d - 1;
  const int n_forced = 1 + (my_c - 1 > 0) + (my_c > 0);
  const int cap = static_cast<int>(p.n_sel) - n_forced;
  float* my_s = top_s + (half * kRows + my_row) * p.n_sel;
  int32_t* my_i = top_i + (half * kRows + my_row) * p.n_sel;
  int count = 0;
  RegTop top;  // kRegTop: this thread's candidates in registers (unused otherwise)
  top.init();

  // K tiles in two buffers: tile it + 1 is copied (cp.async) while tile it is used.
  constexpr int kKTileElems = kKeyTile * (kWgmma ? DK : tile_stride(DK));
  const auto issue = [&](int64_t k0) {
    const int64_t nk = keys.end - k0 < kKeyTile ? keys.end - k0 : kKeyTile;
    bf16* dst = ks + ((k0 / kKeyTile) & 1) * kKTileElems;
    const auto row = [&](int i) -> const bf16* {
      return i < nk ? kv.k + (k0 + i) * kv.k_stride : nullptr;
    };
    if constexpr (kWgmma) {
      load_sw_tile<DK, kKeyTile, kThreads>(reinterpret_cast<unsigned char*>(dst), row, threadIdx.x);
    } else {
      load_tile<DK, true>(dst, kKeyTile, row, threadIdx.x, kThreads);
    }
    cp_async_commit();
  };
  const auto q_row = [&](int64_t hh, int r) -> const bf16* {
    return r < tile.rows ? p.q + ((start + tile.first + r) * p.H + g * hpg + hh) * DK : nullptr;
  };
  if (kQShared && keys.end > 0) {  // joins the first K tile's commit group
    for (int64_t hh = 0; hh < hpg; ++hh) {
      load_tile<DK, true>(
          qs + hh * kRows * tile_stride(DK), kRows, [&](int r) { return q_row(hh, r); },
          threadIdx.x, kThreads);
    }
  }
  if (keys.end > 0) issue(0);
  int jb = 0;  // blocks below jb are scored
  for (int64_t k0 = 0;; k0 += kKeyTile) {
    const bool final = k0 + kKeyTile >= keys.end;
    __syncthreads();  // strip and the K buffer of tile k0 + 64 are free
    if (k0 < keys.end) {
      if (!final) {
        issue(k0 + kKeyTile);
        cp_async_wait<1>();
      } else {
        cp_async_wait<0>();
      }
      if constexpr (kWgmma) fence_proxy_async_smem();
      __syncthreads();
      const bf16* kt = ks + ((k0 / kKeyTile) & 1) * kKTileElems;
      float gp[kKeyTile / 8][4] = {};
      // Which of this thread's 32 scores are visible: the same for every head of the group, so
      // it is worked out once per tile (bit 4·nt + e), or not at all when the warp's rows see the
      // whole tile.
      const int w_first = static_cast<int>(tile.first) + warp * 16;
      const bool whole = warp * 16 + 16 <= tile.rows && k0 + kKeyTile <= keys.end &&
                         all_visible<Branch::kCmp>(m, w_first, w_first + 15, static_cast<int>(k0),
                                                   static_cast<int>(k0) + kKeyTile - 1);
      uint32_t vis_bits = ~0u;
      if (!whole) {
#pragma unroll
        for (int nt = 0; nt < kKeyTile / 8; ++nt) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int t = static_cast<int>(tile.first) + r_lo + (e >> 1) * 8;
            const int j = static_cast<int>(k0) + nt * 8 + 2 * tq + (e & 1);
            const bool vis = r_lo + (e >> 1) * 8 < tile.rows && j < keys.end &&
                             key_visible<Branch::kCmp>(m, t, j);
            if (!vis) vis_bits &= ~(1u << (4 * nt + e));
          }
        }
      }
      for (int64_t hh = 0; hh < hpg; ++hh) {
        uint32_t qf[DK / 16][4];
        if constexpr (kQShared) {
          const bf16* qh = qs + hh * kRows * tile_stride(DK);
#pragma unroll
          for (int kk = 0; kk < DK / 16; ++kk)
            load_a(qf[kk], qh, tile_stride(DK), warp * 16, kk * 16);
        } else {
          load_a_rows<DK>(qf, [&](int r) { return q_row(hh, warp * 16 + r); });
        }
        const float lo = lse2[hh * kRows + r_lo], hi = lse2[hh * kRows + r_lo + 8];
        // On mma.sync the tile's keys in two halves of 32: a half's scores take 16 registers, not
        // 32 (the register cap of four CTAs per SM, select_min_ctas).
        constexpr int kHalves = kWgmma ? 1 : 2, kNt = kKeyTile / 8 / kHalves;
#pragma unroll
        for (int hs = 0; hs < kHalves; ++hs) {
          float s[kNt][4];
          if constexpr (kWgmma) {
            wgmma_a_bt<DK, kKeyTile>(s, qf, reinterpret_cast<const unsigned char*>(kt));
          } else {
#pragma unroll
            for (int nt = 0; nt < kNt; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
            mma_a_bt<DK, kNt>(s, qf, kt + hs * kNt * 8 * tile_stride(DK));
          }
          const auto accumulate = [&](auto whole_tile) {
#pragma unroll
            for (int nt = 0; nt < kNt; ++nt) {
              const int ng = hs * kNt + nt;  // the n-tile within the key tile
#pragma unroll
              for (int e = 0; e < 4; ++e) {
                const float pr = fast_exp2(fmaf(s[nt][e], sl2, -(e < 2 ? lo : hi)));
                if constexpr (decltype(whole_tile)::value) {
                  gp[ng][e] += pr;
                } else {
                  gp[ng][e] += (vis_bits >> (4 * ng + e)) & 1u ? pr : 0.0f;
                }
              }
            }
          };
          if (whole) {
            accumulate(std::true_type{});
          } else {
            accumulate(std::false_type{});
          }
        }
      }
#pragma unroll
      for (int nt = 0; nt < kKeyTile / 8; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          strip[(r_lo + (e >> 1) * 8) * width + halo + nt * 8 + 2 * tq + (e & 1)] = gp[nt][e];
        }
      }
    }
    __syncthreads();

    // Score the blocks completed by this tile (all remaining ones after the last tile).
    const int k0i = static_cast<int>(k0);
    const int je = final ? static_cast<int>(last) / l_sel + 1 : (k0i + kKeyTile) * d / l_sel;
    if (has_row && cap > 0) {
      const float* row_strip = strip + my_row * width + halo;  // token k0 + x at row_strip[x]
      // kRegTop: the blocks that beat the list's last entry wait in a queue (entry k at
      // [k·kThreads] of this thread's column of top_s / top_i, unused until the end) and join the
      // list after the tile's scoring, in block order: the warp then runs as many insertions as
      // its busiest thread needs, not one whenever any thread inserts (those divergent insertions
      // were ~40 % of the kernel's stall samples, Nsight Compute).
      float* q_s = top_s + threadIdx.x;
      int32_t* q_i = top_i + threadIdx.x;
      int nq = 0;
      const auto flush = [&] {
        for (int k = 0; k < nq; ++k) {
          const float cs = q_s[k * kThreads];
          if (cs > top.s[kRegTopMax - 1]) top.insert(cs, q_i[k * kThreads]);
        }
        nq = 0;
      };
      const int j0 = jb > 1 ? jb : 1;
      for (int j = j0 + ((j0 & 1) != half); j < je && j <= my_c - 2; j += 2) {
        const int lo_row = j * l_sel, hi_row = lo_row + l_sel;
        float score = 0.0f;
        if (periodic) {  // tokens j·per − lead + k, k < per + lead, all overlapping (see above)
          const int i0 = j * per - lead;
#pragma unroll 4
          for (int k = i0 < 0 ? -i0 : 0; k < per + lead && i0 + k < my_nv; ++k) {
            const int a = (k - lead) * d;  // token start − block start
            const int overlap = (a + l < l_sel ? a + l : l_sel) - (a > 0 ? a : 0);
            score += row_strip[i0 + k - k0i] * static_cast<float>(overlap) * inv_l;
          }
        } else {
          int i = lo_row - l + 1 > 0 ? (lo_row - l + 1 + d - 1) / d : 0;
          for (; i < my_nv && i * d < hi_row; ++i) {
            const int a = i * d, b = a + l;
            const int overlap = (b < hi_row ? b : hi_row) - (a > lo_row ? a : lo_row);
            if (overlap > 0) score += row_strip[i - k0i] * static_cast<float>(overlap) * inv_l;
          }
        }
        if constexpr (kRegTop) {
          if (score > top.s[kRegTopMax - 1]) {  // ties: the earlier block stays
            q_s[nq * kThreads] = score, q_i[nq * kThreads] = j;
            if (++nq == static_cast<int>(p.n_sel)) flush();
          }
        } else {
          if (count == cap && !(score > my_s[count - 1])) continue;
          int pos = count < cap ? count++ : count - 1;
          while (pos > 0 && score > my_s[pos - 1]) {
            my_s[pos] = my_s[pos - 1], my_i[pos] = my_i[pos - 1];
            --pos;
          }
          my_s[pos] = score, my_i[pos] = j;
        }
      }
      if constexpr (kRegTop) flush();
    }
    if (je > jb) jb = je;
    if (final) break;
    __syncthreads();
    for (int i = threadIdx.x; i < kRows * halo; i += kThreads) {
      const int r = i / halo, c = i % halo;
      strip[r * width + c] = strip[r * width + kKeyTile + c];
    }
  }

  if constexpr (kRegTop) {  // the register list's first `cap` entries are this thread's top list
    __syncthreads();        // every thread's queue (in other threads' lists) is done
    count = 0;
#pragma unroll
    for (int k = 0; k < kRegTopMax; ++k) {
      if (k < cap && top.i[k] != kNoBlock) {
        my_s[k] = top.s[k], my_i[k] = top.i[k];
        count = k + 1;
      }
    }
  }
  top_n[threadIdx.x] = count;
  __syncthreads();
  if (has_row && half == 0) {
    int32_t* dst = p.sel_idx + ((start + my_t) * p.G + g) * p.n_sel;
    // Merge the two lists (each sorted by score desc, index asc) into the first `cap` candidates.
    const float* os = top_s + (kRows + my_row) * p.n_sel;
    const int32_t* oi = top_i + (kRows + my_row) * p.n_sel;
    const int other = top_n[kRows + my_row];
    int32_t* out = merged + my_row * p.n_sel;
    int a = 0, b = 0, n = 0;
    for (; n < cap && (a < count || b < other); ++n) {
      const bool take_a =
          b >= other || (a < count && (my_s[a] > os[b] || (my_s[a] == os[b] && my_i[a] < oi[b])));
      out[n] = take_a ? my_i[a++] : oi[b++];
    }
    count = n;
    my_i = out;
    // Forced blocks and the chosen candidates, sorted ascending into my_i (n_sel slots).
    for (int k = count - 1; k >= 0; --k) my_i[k + n_forced] = my_i[k];
    my_i[0] = 0;
    if (my_c - 1 > 0) my_i[1] = my_c - 1;
    if (my_c > 0) my_i[n_forced - 1] = my_c;
    const int total = n_forced + count;
    for (int a = 1; a < total; ++a) {
      const int32_t x = my_i[a];
      int b = a - 1;
      while (b >= 0 && my_i[b] > x) my_i[b + 1] = my_i[b], --b;
      my_i[b + 1] = x;
    }
    for (int64_t k = 0; k < p.n_sel; ++k) dst[k] = k < total ? my_i[k] : -1;
  }
}

}  // namespace

void launch_select_blocks(const NsaParams& p, const RowTile* tiles, int64_t n_tiles,
                          cudaStream_t stream, SelectQ q) {
  if (n_tiles == 0) return;
  const int halo = strip_halo(p);
  NSA_CHECK(halo <= kKeyTile, "CUDA block selection: (l_sel + l) / d = ", (p.l_sel + p.l) / p.d,
            " must be below ", kKeyTile);
  dispatch_head_dims(p.dk, p.dv, [&](auto DK, auto) {
    // The register list costs ~40 registers: for the widest heads that would cost a CTA per SM.
    bool reg_top = false;
    if constexpr (DK() <= 128) reg_top = p.n_sel - 1 <= kRegTopMax;
    const bool q_shared = reg_top && select_q_shared(q, DK(), p.hpg, n_tiles * p.G);
    auto kernel = select_blocks_kernel<DK(), false, false>;
    if constexpr (DK() <= 128) {
      if (reg_top) {
        kernel = q_shared ? select_blocks_kernel<DK(), true, true>
                          : select_blocks_kernel<DK(), true, false>;
      }
    }
    const size_t smem =
        static_cast<size_t>(select_smem(DK(), p.hpg, p.n_sel, halo, q_shared).total) +
        (select_wgmma(DK()) ? kSwAlignSlack : 0);
    set_kernel_smem(kernel, smem);
    kernel<<<dim3(static_cast<unsigned>(n_tiles), static_cast<unsigned>(p.G)), kThreads, smem,
             stream>>>(p, tiles, halo);
    NSA_CUDA_LAUNCH_CHECK();
  });
}

}  // namespace nsa::cuda
