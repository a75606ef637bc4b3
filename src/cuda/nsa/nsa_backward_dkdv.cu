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
//
// The selected branch's dq rides along (v3, kDq): each tile's dSᵀ is also staged in shared memory
// (bf16) and dq_pair = dS · K_unit is written per (query, head, slot, unit of the block) for the
// merge in sel_block_major.cu, so S and dP are computed once for dK, dV and dq. The partials are
// bounded by processing query rows in passes (SelBlockMajor::backward).
#include "common/cuda_check.h"
#include "head_dims.h"
#include "nsa_backward_dkdv.h"
#include "nsa_kernels.h"
#include "pair_tiles.cuh"
#include "tiles.cuh"

namespace nsa::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
static_assert(kDkdvUnitRows == 16 * kWarps, "one warp per 16 key rows");

// dS tile of the fused selected-branch dq: QT pairs × 64 unit rows.
template <int DK, bool kDq>
__host__ __device__ constexpr size_t ds_tile_bytes() {
  return kDq ? PairStage<DK, DK, true>::QT * tile_stride(kDkdvUnitRows) * sizeof(bf16) : 0;
}

template <int DK, int DV, bool kDq>
__host__ __device__ constexpr size_t dkdv_smem_bytes() {
  return kDkdvUnitRows * (tile_stride(DK) + tile_stride(DV)) * sizeof(bf16) +
         2 * PairStage<DK, DV, true>::kBytes + ds_tile_bytes<DK, kDq>();
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

// Up to 64-wide heads the accumulators fit in 168 registers: three CTAs per SM instead of two.
template <int DK>
constexpr int dkdv_min_blocks() {
  return DK <= 64 ? 3 : 1;
}

// Where a CTA's dK/dV go. slots == 0: straight into the gradient (added to it with `accumulate`).
// Otherwise into partial slot (z0 + z) % slots, z = blockIdx.z: stored on a slot's first use
// (z0 + z < slots), added to it afterwards; launches on one stream keep that order fixed.
struct DkdvOut {
  float* k;
  float* v;
  int64_t rows;  // key rows of the gradient (T, or C for the compressed branch)
  int64_t slots, z0;
  bool accumulate;
};

// The fused selected-branch dq (kDq): entries of query rows [r0, r1) only; their unscaled
// Σ_j dS_j k_j over the unit's keys goes to part[(((row − r0)·H + head)·n_sel + slot)·upb + ub]
// (bf16, dk wide), ub the unit's index within its block and upb = ⌈l_sel / 64⌉.
struct SelDq {
  int64_t r0, r1;
  bf16* part;
};

// The fused dq of one pair tile: warp w takes pair group w % PG (16 pairs) and column chunks
// w / PG, w / PG + 4 / PG, ... of dq = dS · K_unit, with dS staged in ds_s by every warp.
template <int DK, int QT>
__device__ __forceinline__ void sel_tile_dq(const NsaParams& p, const SelDq& dq, const bf16* ds_s,
                                            const bf16* ks, const int64_t th[2],
                                            const int32_t slot[2], int64_t ub, int64_t upb) {
  constexpr int PG = QT / 16, CW = DK < 64 ? DK : 64, NC = DK / CW,
                SDS = tile_stride(kDkdvUnitRows);
  static_assert(4 % PG == 0 && DK % CW == 0 && CW % 16 == 0, "dq work split");
  const int warp = threadIdx.x >> 5, tq = threadIdx.x & 3;
  const int pg = warp % PG;
  uint32_t a[kDkdvUnitRows / 16][4];
#pragma unroll
  for (int kk = 0; kk < kDkdvUnitRows / 16; ++kk) load_a(a[kk], ds_s, SDS, pg * 16, kk * 16);
  for (int cc = warp / PG; cc < NC; cc += 4 / PG) {
    float acc[CW / 8][4] = {};
#pragma unroll
    for (int kk = 0; kk < kDkdvUnitRows / 16; ++kk) {
#pragma unroll
      for (int nt = 0; nt < CW / 8; nt += 2) {
        uint32_t b[4];
        load_b_cols_x2(b, ks, tile_stride(DK), kk * 16, cc * CW + nt * 8);
        mma_16816(acc[nt], a[kk], b);
        mma_16816(acc[nt + 1], a[kk], b + 2);
      }
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      if (th[r] < 0) continue;
      const int64_t idx = ((th[r] - dq.r0 * p.H) * p.n_sel + slot[r]) * upb + ub;
      bf16* dst = dq.part + idx * DK + cc * CW + 2 * tq;
#pragma unroll
      for (int nt = 0; nt < CW / 8; ++nt) {
        *reinterpret_cast<uint32_t*>(dst + nt * 8) = pack_bf16(acc[nt][2 * r], acc[nt][2 * r + 1]);
      }
    }
  }
}

template <int DK, int DV, Branch B, bool kDq>
__global__ void __launch_bounds__(kThreads, dkdv_min_blocks<DK>())
    dkdv_kernel(const NsaParams p, const RowTile* __restrict__ units, int64_t chunks,
                const DkdvOut out, const SelDq dq) {
  static_assert(!kDq || B == Branch::kSel, "the fused dq is the selected branch's");
  using Stage = PairStage<DK, DV, true>;
  constexpr int QT = Stage::QT, SK = tile_stride(DK), SV = tile_stride(DV);
  constexpr int SDS = tile_stride(kDkdvUnitRows);
  constexpr int c = static_cast<int>(B);
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* ks = reinterpret_cast<bf16*>(smem);
  bf16* vs = ks + kDkdvUnitRows * SK;
  unsigned char* stage_base = reinterpret_cast<unsigned char*>(vs + kDkdvUnitRows * SV);
  bf16* ds_s = reinterpret_cast<bf16*>(stage_base + 2 * Stage::kBytes);

  const int64_t g = blockIdx.y, z = blockIdx.z, G = p.G;
  const int hpg = static_cast<int>(p.hpg);
  const int warp = threadIdx.x >> 5, gid = (threadIdx.x & 31) >> 2, tq = threadIdx.x & 3;
  const RowTile unit = units[blockIdx.x];
  const UnitQueries u =
      kDq ? unit_queries<B>(p, unit, g, dq.r0, dq.r1) : unit_queries<B>(p, unit, g);
  const PairList pairs = chunk_pairs(u, z, chunks, hpg, static_cast<int>(p.n_sel));
  const int n_pairs = pairs.n;

  // Chunked: partial slot (z0 + z) % slots; otherwise the gradient itself.
  const int64_t key_base =
      B == Branch::kCmp ? p.cmp_offsets[unit.seq] + unit.first : u.seq_start + unit.first;
  const int64_t zi = out.z0 + z, slot_z = out.slots > 0 ? zi % out.slots : 0;
  const bool acc = out.slots > 0 ? zi >= out.slots : out.accumulate;
  if (n_pairs == 0 && acc) return;  // nothing to add
  float* dst_k = out.k + slot_z * out.rows * G * DK;
  float* dst_v = out.v + slot_z * out.rows * G * DV;

  const KvRows kv = branch_rows<B>(p, unit.seq, g);
  load_tile<DK>(
      ks, kDkdvUnitRows,
      [&](int i) { return i < unit.rows ? kv.k + (unit.first + i) * kv.k_stride : nullptr; },
      threadIdx.x, kThreads);
  load_tile<DV>(
      vs, kDkdvUnitRows,
      [&](int i) { return i < unit.rows ? kv.v + (unit.first + i) * kv.v_stride : nullptr; },
      threadIdx.x, kThreads);

  const auto issue = [&](int pb, const Stage& st) { fill_pair_stage<c>(p, pairs, g, pb, st); };

  const int jl_lo = warp * 16 + gid;  // this thread's unit rows: jl_lo and jl_lo + 8
  const int j0 = static_cast<int>(unit.first) + warp * 16;  // the warp's first key
  const bool warp_full = warp * 16 + 16 <= unit.rows;
  const MaskParams m = mask_params(p);
  const float sl2 = p.scale * kLog2e;
  const int64_t upb = (p.l_sel + kDkdvUnitRows - 1) / kDkdvUnitRows;
  const int64_t ub = (unit.first % p.l_sel) / kDkdvUnitRows;
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
    st.finish_stats();
    __syncthreads();

    float sc[QT / 8][4] = {}, dpt[QT / 8][4] = {};
    mma_smem_a_bt<DK, QT / 8>(sc, ks, warp * 16, st.q);
    mma_smem_a_bt<DV, QT / 8>(dpt, vs, warp * 16, st.d_o);
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
        if constexpr (kDq) ds_s[col * SDS + jl] = __float2bfloat16(dpt[nt][e]);
      }
    }
    mma_c_b<DV, QT / 16>(dv, sc, st.d_o);
    mma_c_b<DK, QT / 16>(dk, dpt, st.q);
    int64_t th[2] = {-1, -1};
    int32_t slot[2] = {0, 0};
    if constexpr (kDq) {
      const int pg = warp % (QT / 16);
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        th[r] = st.th[pg * 16 + gid + 8 * r];
        slot[r] = st.slot[pg * 16 + gid + 8 * r];
      }
    }
    __syncthreads();  // stage it & 1 is refilled by the next iteration's issue; ds_s is complete
    if constexpr (kDq) sel_tile_dq<DK, QT>(p, dq, ds_s, ks, th, slot, ub, upb);
  }

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

template <Branch B, bool kDq>
void launch_branch(const NsaParams& p, const RowTile* units, int64_t n_units, int64_t chunks,
                   const DkdvOut& out, const SelDq& dq, cudaStream_t stream) {
  if (n_units == 0) return;
  dispatch_head_dims(p.dk, p.dv, [&](auto DK, auto DV) {
    const auto kernel = dkdv_kernel<DK(), DV(), B, kDq>;
    const size_t smem = dkdv_smem_bytes<DK(), DV(), kDq>();
    set_kernel_smem(kernel, smem);
    const dim3 grid(static_cast<unsigned>(n_units), static_cast<unsigned>(p.G),
                    static_cast<unsigned>(chunks));
    kernel<<<grid, kThreads, smem, stream>>>(p, units, chunks, out, dq);
    NSA_CUDA_LAUNCH_CHECK();
  });
}

// The gradient rows of a branch and where they go.
DkdvOut branch_out(const NsaParams& p, Branch branch) {
  switch (branch) {
    case Branch::kWin:
      return {p.d_k[2], p.d_v[2], p.T, 0, 0, false};
    case Branch::kSel:
      return {p.d_k[1], p.d_v[1], p.T, 0, 0, false};
    case Branch::kCmp:
      break;
  }
  return {p.d_k_cmp, p.d_v_cmp, p.C, 0, 0, false};
}

}  // namespace

void launch_nsa_backward_dkdv(const NsaParams& p, Branch branch, const RowTile* units,
                              int64_t n_units, int64_t chunks, bool accumulate, float* partial,
                              cudaStream_t stream) {
  DkdvOut out = branch_out(p, branch);
  out.accumulate = accumulate;
  const DkdvOut direct = out;
  if (chunks > 1) {
    out.k = partial;
    out.v = partial + chunks * out.rows * p.G * p.dk;
    out.slots = chunks;
  }
  const SelDq none{0, 0, nullptr};
  switch (branch) {
    case Branch::kWin:
      launch_branch<Branch::kWin, false>(p, units, n_units, chunks, out, none, stream);
      break;
    case Branch::kSel:
      launch_branch<Branch::kSel, false>(p, units, n_units, chunks, out, none, stream);
      break;
    case Branch::kCmp:
      launch_branch<Branch::kCmp, false>(p, units, n_units, chunks, out, none, stream);
      break;
  }
  if (chunks > 1) launch_sum_dkdv_partials(p, branch, chunks, direct.accumulate, partial, stream);
}

void launch_sel_dkdv_dq(const NsaParams& p, const RowTile* units, int64_t n_units, int64_t chunks,
                        const SelDqPass& pass, float* partial, cudaStream_t stream) {
  NSA_CHECK(chunks <= pass.slots, "selected dK/dV: ", chunks, " chunks > ", pass.slots, " slots");
  DkdvOut out = branch_out(p, Branch::kSel);
  out.k = partial;
  out.v = partial + pass.slots * p.T * p.G * p.dk;
  out.slots = pass.slots;
  out.z0 = pass.z0;
  launch_branch<Branch::kSel, true>(p, units, n_units, chunks, out,
                                    SelDq{pass.r0, pass.r1, pass.dq_part}, stream);
}

void launch_sum_dkdv_partials(const NsaParams& p, Branch branch, int64_t slots, bool accumulate,
                              const float* partial, cudaStream_t stream) {
  const DkdvOut out = branch_out(p, branch);
  const int64_t nk = out.rows * p.G * p.dk, nv = out.rows * p.G * p.dv;
  sum_chunks_kernel<<<static_cast<unsigned>((nk + 255) / 256), 256, 0, stream>>>(partial, out.k, nk,
                                                                                 slots, accumulate);
  NSA_CUDA_LAUNCH_CHECK();
  sum_chunks_kernel<<<static_cast<unsigned>((nv + 255) / 256), 256, 0, stream>>>(
      partial + slots * nk, out.v, nv, slots, accumulate);
  NSA_CUDA_LAUNCH_CHECK();
}

}  // namespace nsa::cuda
