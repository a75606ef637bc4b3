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
#include "pair_tiles.cuh"
#include "tiles.cuh"

namespace nsa::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
static_assert(kDkdvUnitRows == 16 * kWarps, "one warp per 16 key rows");

template <int DK, int DV>
__host__ __device__ constexpr size_t dkdv_smem_bytes() {
  return kDkdvUnitRows * (tile_stride(DK) + tile_stride(DV)) * sizeof(bf16) +
         2 * PairStage<DK, DV, true>::kBytes;
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

template <int DK, int DV, Branch B>
__global__ void __launch_bounds__(kThreads, dkdv_min_blocks<DK>())
    dkdv_kernel(const NsaParams p, const RowTile* __restrict__ units, int64_t chunks,
                float* __restrict__ out_k, float* __restrict__ out_v, bool accumulate) {
  using Stage = PairStage<DK, DV, true>;
  constexpr int QT = Stage::QT, SK = tile_stride(DK), SV = tile_stride(DV);
  constexpr int c = static_cast<int>(B);
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* ks = reinterpret_cast<bf16*>(smem);
  bf16* vs = ks + kDkdvUnitRows * SK;
  unsigned char* stage_base = reinterpret_cast<unsigned char*>(vs + kDkdvUnitRows * SV);

  const int64_t g = blockIdx.y, z = blockIdx.z, G = p.G;
  const int hpg = static_cast<int>(p.hpg);
  const int warp = threadIdx.x >> 5, gid = (threadIdx.x & 31) >> 2, tq = threadIdx.x & 3;
  const RowTile unit = units[blockIdx.x];
  if (unit.rows == 0) return;  // padding of a device-built table (device_layout.h)
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

  const PairList pairs = chunk_pairs(u, z, chunks, hpg);
  const int n_pairs = pairs.n;
  const auto issue = [&](int pb, const Stage& st) { fill_pair_stage<c>(p, pairs, g, pb, st); };

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
