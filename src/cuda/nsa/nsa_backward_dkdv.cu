// NSA backward on tensor cores (v2), part 2: dK/dV of each branch, key-centric and deterministic.
//
// A CTA owns a unit of at most 64 key rows of one group (raw rows for the window, compressed
// tokens for the compressed branch, rows of one selection block for the selected branch); warp w
// owns unit rows 16w..16w+15. The queries that can see the unit – a row range for window and
// compressed, the inverted index's entry list for the selected branch – are flattened with the
// group's heads into (query, head) pairs and walked in tiles of QT pairs staged in shared memory:
//   Sᵀ = K·Qᵀ, dPᵀ = V·dOᵀ (tensor cores), Pᵀ = exp(Sᵀ − lse), dSᵀ = Pᵀ ∘ (g·dPᵀ − delta),
//   dV += (g·Pᵀ)·dO, dK += scale·dSᵀ·Q, with the accumulators in registers.
// No atomics: pairs are visited in ascending order. Long query lists are split into `chunks` CTAs
// that write partial sums; a second kernel adds the partials in chunk order.
#include "common/cuda_check.h"
#include "head_dims.h"
#include "nsa_backward_dkdv.h"
#include "nsa_kernels.h"
#include "tiles.cuh"

namespace nsa::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
static_assert(kDkdvUnitRows == 16 * kWarps, "one warp per 16 key rows");

// (query, head) pairs per tile: 32 for the widest heads keeps dK, dV, Sᵀ and dPᵀ in registers.
// Pair tiles are double-buffered (cp.async) so the next tile loads while this one is used.
template <int DK>
constexpr int pair_tile() {
  return DK > 128 ? 32 : 64;
}

// One stage of the pair pipeline: Q and dO rows of QT (query, head) pairs and their statistics.
template <int DK, int DV>
struct PairStage {
  static constexpr int QT = pair_tile<DK>();
  static constexpr size_t kBytes = QT * sizeof(int64_t) +
                                   QT * (tile_stride(DK) + tile_stride(DV)) * sizeof(bf16) +
                                   QT * 4 * sizeof(float);
  int64_t* th;  // query row·H + head, −1 for padding pairs
  bf16* q;
  bf16* d_o;
  float *lse2, *delta, *gate;
  int32_t* t;  // query position in the sequence, −1 for padding pairs
  __device__ explicit PairStage(unsigned char* base)
      : th(reinterpret_cast<int64_t*>(base)),
        q(reinterpret_cast<bf16*>(th + QT)),
        d_o(q + QT * tile_stride(DK)),
        lse2(reinterpret_cast<float*>(d_o + QT * tile_stride(DV))),
        delta(lse2 + QT),
        gate(delta + QT),
        t(reinterpret_cast<int32_t*>(gate + QT)) {}
};

template <int DK, int DV>
__host__ __device__ constexpr size_t dkdv_smem_bytes() {
  return kDkdvUnitRows * (tile_stride(DK) + tile_stride(DV)) * sizeof(bf16) +
         2 * PairStage<DK, DV>::kBytes;
}

// Which queries see unit u: positions [q_begin, q_end) of a row range (query row =
// seq_start + position) or of the selected branch's entry list.
struct UnitQueries {
  int64_t seq_start, q_begin, q_end;
  const uint64_t* list;
};

template <Branch B>
__device__ UnitQueries unit_queries(const NsaParams& p, const RowTile& unit, int64_t g) {
  UnitQueries u;
  const int64_t n = unit.seq;
  u.seq_start = p.cu_seqlens[n];
  const int64_t len = p.cu_seqlens[n + 1] - u.seq_start;
  u.list = nullptr;
  if constexpr (B == Branch::kWin) {
    u.q_begin = unit.first;
    const int64_t last = unit.first + unit.rows - 1 + p.w - 1;
    u.q_end = last + 1 < len ? last + 1 : len;
  } else if constexpr (B == Branch::kCmp) {
    u.q_begin = unit.first * p.d + p.l - 1;
    u.q_end = len;
  } else {
    const int64_t seg = g * p.TB + p.blk_offsets[n] + unit.first / p.l_sel;
    u.q_begin = p.sel_seg_start[seg];
    u.q_end = p.sel_seg_end[seg];
    u.list = p.sel_entries;
  }
  if (u.q_end < u.q_begin) u.q_end = u.q_begin;
  return u;
}

// out row (=, or +=) x for one row half of a warp's 16 × D accumulator.
template <int D>
__device__ void store_rows(float* dst, const float acc[][4], int r, float scale, bool accumulate) {
  const int tq = threadIdx.x & 3;
#pragma unroll
  for (int nt = 0; nt < D / 8; ++nt) {
    float2* d = reinterpret_cast<float2*>(dst + nt * 8 + 2 * tq);
    float2 v = make_float2(scale * acc[nt][2 * r], scale * acc[nt][2 * r + 1]);
    if (accumulate) v.x += d->x, v.y += d->y;
    *d = v;
  }
}

template <int DK, int DV, Branch B>
__global__ void __launch_bounds__(kThreads)
    dkdv_kernel(const NsaParams p, const RowTile* __restrict__ units, int64_t chunks,
                float* __restrict__ out_k, float* __restrict__ out_v, bool accumulate) {
  using Stage = PairStage<DK, DV>;
  constexpr int QT = Stage::QT, SK = tile_stride(DK), SV = tile_stride(DV);
  constexpr int c = static_cast<int>(B);
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* ks = reinterpret_cast<bf16*>(smem);
  bf16* vs = ks + kDkdvUnitRows * SK;
  unsigned char* stage_base = reinterpret_cast<unsigned char*>(vs + kDkdvUnitRows * SV);

  const int64_t g = blockIdx.y, z = blockIdx.z, G = p.G, H = p.H;
  const int hpg = static_cast<int>(p.hpg);
  const int warp = threadIdx.x >> 5, gid = (threadIdx.x & 31) >> 2, tq = threadIdx.x & 3;
  const RowTile unit = units[blockIdx.x];
  const UnitQueries u = unit_queries<B>(p, unit, g);
  const KvRows kv = branch_rows<B>(p, unit.seq, g);
  load_tile<DK>(
      ks, kDkdvUnitRows,
      [&](int i) { return i < unit.rows ? kv.k + (unit.first + i) * kv.k_stride : nullptr; },
      threadIdx.x, kThreads);
  load_tile<DV>(
      vs, kDkdvUnitRows,
      [&](int i) { return i < unit.rows ? kv.v + (unit.first + i) * kv.v_stride : nullptr; },
      threadIdx.x, kThreads);

  const int64_t total = u.q_end - u.q_begin;
  const int64_t qa = u.q_begin + total * z / chunks, qb = u.q_begin + total * (z + 1) / chunks;
  const int n_pairs = static_cast<int>((qb - qa) * hpg);
  // Pair i of the chunk: query row (global) and head; rows ascend with i.
  const auto pair_row = [&](int i) -> int64_t {
    const int64_t qi = qa + i / hpg;
    return u.list ? static_cast<int64_t>(u.list[qi] & 0xffffffffu) : u.seq_start + qi;
  };
  // Fills a stage with pairs pb..pb+QT−1: indices and statistics first (one thread per pair),
  // then Q and dO rows by cp.async (committed; the caller waits).
  const auto issue = [&](int pb, const Stage& st) {
    for (int i = threadIdx.x; i < QT; i += kThreads) {
      const int64_t th =
          pb + i < n_pairs ? pair_row(pb + i) * H + g * hpg + (pb + i) % hpg : int64_t{-1};
      st.th[i] = th;
      st.lse2[i] = th < 0 ? 0.0f : p.lse[c][th] * kLog2e;
      st.delta[i] = th < 0 ? 0.0f : p.delta[c][th];
      st.gate[i] = th < 0 ? 0.0f : __bfloat162float(p.gate[c][th]);
      st.t[i] = th < 0 ? -1 : static_cast<int32_t>(th / H - u.seq_start);
    }
    __syncthreads();
    load_tile<DK, true>(
        st.q, QT, [&](int i) { return st.th[i] < 0 ? nullptr : p.q + st.th[i] * DK; }, threadIdx.x,
        kThreads);
    load_tile<DV, true>(
        st.d_o, QT, [&](int i) { return st.th[i] < 0 ? nullptr : p.d_o + st.th[i] * DV; },
        threadIdx.x, kThreads);
    cp_async_commit();
  };

  const int jl_lo = warp * 16 + gid;  // this thread's unit rows: jl_lo and jl_lo + 8
  const int j0 = static_cast<int>(unit.first) + warp * 16;  // the warp's first key
  const bool warp_full = warp * 16 + 16 <= unit.rows;
  const MaskParams m = mask_params(p);
  const float sl2 = p.scale * kLog2e;
  float dk[DK / 8][4] = {}, dv[DV / 8][4] = {};
  const int n_tiles = (n_pairs + QT - 1) / QT;
  if (n_tiles > 0) issue(0, Stage(stage_base));
  for (int it = 0; it < n_tiles; ++it) {
    const Stage st(stage_base + (it & 1) * Stage::kBytes);
    if (it + 1 < n_tiles) {
      issue((it + 1) * QT, Stage(stage_base + ((it + 1) & 1) * Stage::kBytes));
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();

    float sc[QT / 8][4] = {}, dpt[QT / 8][4] = {};
#pragma unroll
    for (int kk = 0; kk < DK / 16; ++kk) {
      uint32_t a[4];
      load_a(a, ks, SK, warp * 16, kk * 16);
#pragma unroll
      for (int nt = 0; nt < QT / 8; ++nt) {
        uint32_t b[2];
        load_b_rows(b, st.q, SK, nt * 8, kk * 16);
        mma_16816(sc[nt], a, b);
      }
    }
#pragma unroll
    for (int kk = 0; kk < DV / 16; ++kk) {
      uint32_t a[4];
      load_a(a, vs, SV, warp * 16, kk * 16);
#pragma unroll
      for (int nt = 0; nt < QT / 8; ++nt) {
        uint32_t b[2];
        load_b_rows(b, st.d_o, SV, nt * 8, kk * 16);
        mma_16816(dpt[nt], a, b);
      }
    }
    const int last = it * QT + QT <= n_pairs ? QT - 1 : -1;
    const bool all = warp_full && last >= 0 && all_visible<B>(m, st.t[0], st.t[last], j0, j0 + 15);
#pragma unroll
    for (int nt = 0; nt < QT / 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int jl = jl_lo + (e >> 1) * 8, col = nt * 8 + 2 * tq + (e & 1);
        const int t = st.t[col];
        const bool vis = all || (jl < unit.rows && t >= 0 &&
                                 key_visible<B>(m, t, static_cast<int>(unit.first) + jl));
        const float pr = vis ? exp2f(sc[nt][e] * sl2 - st.lse2[col]) : 0.0f;
        sc[nt][e] = pr * st.gate[col];
        dpt[nt][e] = pr * (st.gate[col] * dpt[nt][e] - st.delta[col]);
      }
    }
    mma_c_b<DV, QT / 16>(dv, sc, st.d_o);
    mma_c_b<DK, QT / 16>(dk, dpt, st.q);
    __syncthreads();  // stage it & 1 is refilled by the next iteration's issue
  }

  // Chunked: write partial z (plain store); otherwise write or accumulate the result.
  const int64_t key_base =
      B == Branch::kCmp ? p.cmp_offsets[unit.seq] + unit.first : u.seq_start + unit.first;
  const int64_t out_rows = B == Branch::kCmp ? p.C : p.T;
  float* dst_k = out_k + z * out_rows * G * DK;
  float* dst_v = out_v + z * out_rows * G * DV;
  const bool acc = chunks == 1 && accumulate;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int jl = jl_lo + 8 * r;
    if (jl >= unit.rows) continue;
    store_rows<DK>(dst_k + ((key_base + jl) * G + g) * DK, dk, r, p.scale, acc);
    store_rows<DV>(dst_v + ((key_base + jl) * G + g) * DV, dv, r, 1.0f, acc);
  }
}

// out (=, or +=) Σ_z partial[z], in chunk order.
__global__ void sum_chunks_kernel(const float* __restrict__ partial, float* __restrict__ out,
                                  int64_t n, int64_t chunks, bool accumulate) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float acc = accumulate ? out[i] : 0.0f;
  for (int64_t z = 0; z < chunks; ++z) acc += partial[z * n + i];
  out[i] = acc;
}

template <Branch B>
void launch_branch(const NsaParams& p, const RowTile* units, int64_t n_units, int64_t chunks,
                   float* out_k, float* out_v, int64_t out_rows, bool accumulate, float* partial,
                   cudaStream_t stream) {
  if (n_units == 0) return;
  dispatch_head_dims(p.dk, p.dv, [&](auto DK, auto DV) {
    const auto kernel = dkdv_kernel<DK(), DV(), B>;
    const size_t smem = dkdv_smem_bytes<DK(), DV()>();
    set_kernel_smem(kernel, smem);
    const dim3 grid(static_cast<unsigned>(n_units), static_cast<unsigned>(p.G),
                    static_cast<unsigned>(chunks));
    if (chunks == 1) {
      kernel<<<grid, kThreads, smem, stream>>>(p, units, 1, out_k, out_v, accumulate);
      NSA_CUDA_LAUNCH_CHECK();
      return;
    }
    const int64_t nk = out_rows * p.G * p.dk, nv = out_rows * p.G * p.dv;
    float* partial_v = partial + chunks * nk;
    kernel<<<grid, kThreads, smem, stream>>>(p, units, chunks, partial, partial_v, false);
    NSA_CUDA_LAUNCH_CHECK();
    sum_chunks_kernel<<<static_cast<unsigned>((nk + 255) / 256), 256, 0, stream>>>(
        partial, out_k, nk, chunks, accumulate);
    NSA_CUDA_LAUNCH_CHECK();
    sum_chunks_kernel<<<static_cast<unsigned>((nv + 255) / 256), 256, 0, stream>>>(
        partial_v, out_v, nv, chunks, accumulate);
    NSA_CUDA_LAUNCH_CHECK();
  });
}

}  // namespace

void launch_nsa_backward_dkdv(const NsaParams& p, Branch branch, const RowTile* units,
                              int64_t n_units, int64_t chunks, bool accumulate, float* partial,
                              cudaStream_t stream) {
  switch (branch) {
    case Branch::kWin:
      launch_branch<Branch::kWin>(p, units, n_units, chunks, p.d_k[2], p.d_v[2], p.T, accumulate,
                                  partial, stream);
      break;
    case Branch::kSel:
      launch_branch<Branch::kSel>(p, units, n_units, chunks, p.d_k[1], p.d_v[1], p.T, accumulate,
                                  partial, stream);
      break;
    case Branch::kCmp:
      launch_branch<Branch::kCmp>(p, units, n_units, chunks, p.d_k_cmp, p.d_v_cmp, p.C, accumulate,
                                  partial, stream);
      break;
  }
}

}  // namespace nsa::cuda
