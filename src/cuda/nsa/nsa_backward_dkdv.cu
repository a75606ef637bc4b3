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
template <int DK>
constexpr int pair_tile() {
  return DK > 128 ? 32 : 64;
}

template <int DK, int DV>
__host__ __device__ constexpr size_t dkdv_smem_bytes() {
  constexpr int QT = pair_tile<DK>();
  return (kDkdvUnitRows + QT) * (tile_stride(DK) + tile_stride(DV)) * sizeof(bf16) +
         QT * 4 * sizeof(float);
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
  constexpr int QT = pair_tile<DK>(), SK = tile_stride(DK), SV = tile_stride(DV);
  constexpr int c = static_cast<int>(B);
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* ks = reinterpret_cast<bf16*>(smem);
  bf16* vs = ks + kDkdvUnitRows * SK;
  bf16* qs = vs + kDkdvUnitRows * SV;
  bf16* dos = qs + QT * SK;
  float* lse2 = reinterpret_cast<float*>(dos + QT * SV);
  float* delta = lse2 + QT;
  float* gate = delta + QT;
  int32_t* trow = reinterpret_cast<int32_t*>(gate + QT);

  const int64_t g = blockIdx.y, z = blockIdx.z, G = p.G, H = p.H, hpg = p.hpg;
  const int warp = threadIdx.x >> 5, gid = (threadIdx.x & 31) >> 2, tq = threadIdx.x & 3;
  const RowTile unit = units[blockIdx.x];
  const UnitQueries u = unit_queries<B>(p, unit, g);
  const int64_t key_base =
      B == Branch::kCmp ? p.cmp_offsets[unit.seq] + unit.first : u.seq_start + unit.first;
  const auto kv = [&] {
    if constexpr (B == Branch::kCmp) {
      return KvRows<float>{p.k_cmp + (key_base * G + g) * DK, p.v_cmp + (key_base * G + g) * DV,
                           G * DK, G * DV};
    } else {
      return KvRows<bf16>{p.k[c] + (key_base * G + g) * DK, p.v[c] + (key_base * G + g) * DV,
                          G * DK, G * DV};
    }
  }();
  load_tile<DK>(
      ks, kDkdvUnitRows, [&](int i) { return i < unit.rows ? kv.k + i * kv.k_stride : nullptr; },
      threadIdx.x, kThreads);
  load_tile<DV>(
      vs, kDkdvUnitRows, [&](int i) { return i < unit.rows ? kv.v + i * kv.v_stride : nullptr; },
      threadIdx.x, kThreads);

  const int64_t total = u.q_end - u.q_begin;
  const int64_t qa = u.q_begin + total * z / chunks, qb = u.q_begin + total * (z + 1) / chunks;
  const int64_t n_pairs = (qb - qa) * hpg;
  const int jl_lo = warp * 16 + gid;  // this thread's unit rows: jl_lo and jl_lo + 8
  const float sl2 = p.scale * kLog2e;
  float dk[DK / 8][4] = {}, dv[DV / 8][4] = {};

  for (int64_t pb = 0; pb < n_pairs; pb += QT) {
    __syncthreads();  // the previous pair tile is consumed (and the K/V tiles are loaded)
    const auto pair_row = [&](int i) -> int64_t {  // global query row·H + head, or −1
      const int64_t idx = pb + i;
      if (idx >= n_pairs) return -1;
      const int64_t qi = qa + idx / hpg, hh = idx % hpg;
      const int64_t row =
          u.list ? static_cast<int64_t>(u.list[qi] & 0xffffffffu) : u.seq_start + qi;
      return row * H + g * hpg + hh;
    };
    load_tile<DK>(
        qs, QT,
        [&](int i) {
          const int64_t th = pair_row(i);
          return th < 0 ? nullptr : p.q + th * DK;
        },
        threadIdx.x, kThreads);
    load_tile<DV>(
        dos, QT,
        [&](int i) {
          const int64_t th = pair_row(i);
          return th < 0 ? nullptr : p.d_o + th * DV;
        },
        threadIdx.x, kThreads);
    for (int i = threadIdx.x; i < QT; i += kThreads) {
      const int64_t th = pair_row(i);
      lse2[i] = th < 0 ? 0.0f : p.lse[c][th] * kLog2e;
      delta[i] = th < 0 ? 0.0f : p.delta[c][th];
      gate[i] = th < 0 ? 0.0f : __bfloat162float(p.gate[c][th]);
      trow[i] = th < 0 ? -1 : static_cast<int32_t>(th / H - u.seq_start);
    }
    __syncthreads();

    float st[QT / 8][4] = {}, dpt[QT / 8][4] = {};
#pragma unroll
    for (int kk = 0; kk < DK / 16; ++kk) {
      uint32_t a[4];
      load_a(a, ks, SK, warp * 16, kk * 16);
#pragma unroll
      for (int nt = 0; nt < QT / 8; ++nt) {
        uint32_t b[2];
        load_b_rows(b, qs, SK, nt * 8, kk * 16);
        mma_16816(st[nt], a, b);
      }
    }
#pragma unroll
    for (int kk = 0; kk < DV / 16; ++kk) {
      uint32_t a[4];
      load_a(a, vs, SV, warp * 16, kk * 16);
#pragma unroll
      for (int nt = 0; nt < QT / 8; ++nt) {
        uint32_t b[2];
        load_b_rows(b, dos, SV, nt * 8, kk * 16);
        mma_16816(dpt[nt], a, b);
      }
    }
#pragma unroll
    for (int nt = 0; nt < QT / 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int jl = jl_lo + (e >> 1) * 8, col = nt * 8 + 2 * tq + (e & 1);
        const int64_t t = trow[col];
        const bool vis = jl < unit.rows && t >= 0 && key_visible<B>(p, t, unit.first + jl);
        const float pr = vis ? exp2f(st[nt][e] * sl2 - lse2[col]) : 0.0f;
        st[nt][e] = pr * gate[col];
        dpt[nt][e] = pr * (gate[col] * dpt[nt][e] - delta[col]);
      }
    }
    mma_c_b<DV, QT / 16>(dv, st, dos);
    mma_c_b<DK, QT / 16>(dk, dpt, qs);
  }

  // Chunked: write partial z (plain store); otherwise write or accumulate the result.
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
