// NSA backward on the GPU, v1, part 2: dK/dV of each branch, key-centric and deterministic.
//
// A CTA owns a unit of key rows of one group (64 raw rows for the window, 64 compressed tokens
// for the compressed branch, one selection block for the selected branch) and walks the queries
// that can see them in ascending order: a row range for window and compressed, the inverted
// index entry list for the selected branch. Per query, one thread per (head, key row) computes p
// and ds, then all threads add Σ_h p·g·dO_h into dV and Σ_h scale·ds·q_h into dK held in shared
// memory. v1.1: all heads of the group share one barrier pair per query (v1: one pair per head).
// No atomics anywhere. Long query lists are split into `chunks` CTAs that write partial sums;
// a second kernel adds the partials in chunk order.
#include "attend.cuh"
#include "common/cuda_check.h"
#include "nsa_backward_dkdv.h"
#include "nsa_kernels.h"

namespace nsa::cuda {
namespace {

constexpr int kThreads = 128;

struct DkdvSmem {
  int64_t q, d_o, stats, p, ds, dk, dv, total_floats;
};

// q and dO of all heads of the group for one query, (lse, delta, gate) per head, p and ds per
// (head, row), and the unit's dK/dV accumulators.
__host__ __device__ DkdvSmem dkdv_smem(const NsaParams& p, int64_t rows) {
  DkdvSmem s;
  s.q = 0;
  s.d_o = s.q + p.hpg * p.dk;
  s.stats = s.d_o + p.hpg * p.dv;
  s.p = s.stats + 3 * p.hpg;
  s.ds = s.p + p.hpg * rows;
  s.dk = s.ds + p.hpg * rows;
  s.dv = s.dk + rows * p.dk;
  s.total_floats = s.dv + rows * p.dv;
  return s;
}

// Which queries see unit u, and which of its rows each one sees.
struct UnitQueries {
  int64_t first_row, n_rows;  // unit rows (relative: raw row in sequence, or compressed index)
  int64_t seq_start;          // global row of the sequence's first token
  int64_t q_begin, q_end;     // query list positions
  const uint64_t* list;       // selected branch: entries; otherwise queries are seq_start + pos
};

template <DkdvBranch kBranch>
__device__ UnitQueries unit_queries(const NsaParams& p, const DkdvUnit& unit, int64_t g) {
  UnitQueries u;
  const int64_t n = unit.seq;
  u.seq_start = p.cu_seqlens[n];
  const int64_t len = p.cu_seqlens[n + 1] - u.seq_start;
  u.first_row = unit.first;
  u.n_rows = unit.rows;
  u.list = nullptr;
  if (kBranch == DkdvBranch::kWindow) {
    u.q_begin = unit.first;
    const int64_t last = unit.first + unit.rows - 1 + p.w - 1;
    u.q_end = last + 1 < len ? last + 1 : len;
  } else if (kBranch == DkdvBranch::kCompressed) {
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

template <DkdvBranch kBranch>
__global__ void __launch_bounds__(kThreads)
    dkdv_kernel(const NsaParams p, const DkdvUnit* __restrict__ units, int64_t unit_rows,
                int64_t chunks, float* __restrict__ out_k, float* __restrict__ out_v,
                int64_t out_rows, bool accumulate) {
  extern __shared__ float smem[];
  const DkdvSmem L = dkdv_smem(p, unit_rows);
  float* q = smem + L.q;
  float* d_o = smem + L.d_o;
  float* stats = smem + L.stats;
  float* p_s = smem + L.p;
  float* ds_s = smem + L.ds;
  float* dk_acc = smem + L.dk;
  float* dv_acc = smem + L.dv;

  const int64_t g = blockIdx.y, z = blockIdx.z, G = p.G, dk = p.dk, dv = p.dv, hpg = p.hpg;
  const DkdvUnit unit = units[blockIdx.x];
  const UnitQueries u = unit_queries<kBranch>(p, unit, g);
  const int c = kBranch == DkdvBranch::kCompressed ? 0 : (kBranch == DkdvBranch::kSelected ? 1 : 2);
  const bool compressed = kBranch == DkdvBranch::kCompressed;
  const int64_t key_base =
      compressed ? p.cmp_offsets[unit.seq] + u.first_row : u.seq_start + u.first_row;
  const int64_t rows = u.n_rows;
  for (int64_t i = threadIdx.x; i < rows * dk; i += blockDim.x) dk_acc[i] = 0.0f;
  for (int64_t i = threadIdx.x; i < rows * dv; i += blockDim.x) dv_acc[i] = 0.0f;

  const int64_t total = u.q_end - u.q_begin;
  const int64_t qa = u.q_begin + total * z / chunks, qb = u.q_begin + total * (z + 1) / chunks;
  for (int64_t qi = qa; qi < qb; ++qi) {
    const int64_t row = u.list ? static_cast<int64_t>(u.list[qi] & 0xffffffffu) : u.seq_start + qi;
    const int64_t t = row - u.seq_start;
    const int64_t th0 = row * p.H + g * hpg;  // first head of the group
    __syncthreads();  // the previous query's accumulation is done with q/d_o/p_s/ds_s
    for (int64_t e = threadIdx.x; e < hpg * dk; e += blockDim.x) {
      q[e] = __bfloat162float(p.q[th0 * dk + e]);
    }
    for (int64_t e = threadIdx.x; e < hpg * dv; e += blockDim.x) {
      d_o[e] = __bfloat162float(p.d_o[th0 * dv + e]);
    }
    for (int64_t hh = threadIdx.x; hh < hpg; hh += blockDim.x) {
      stats[3 * hh] = p.lse[c][th0 + hh];
      stats[3 * hh + 1] = p.delta[c][th0 + hh];
      stats[3 * hh + 2] = __bfloat162float(p.gate[c][th0 + hh]);
    }
    __syncthreads();
    // One (head, key row) pair per thread: p·g and scale·ds.
    for (int64_t item = threadIdx.x; item < hpg * rows; item += blockDim.x) {
      const int64_t hh = item / rows, j = item % rows, r = u.first_row + j;
      bool visible;
      if (kBranch == DkdvBranch::kWindow) {
        visible = r <= t && r > t - p.w;
      } else if (kBranch == DkdvBranch::kCompressed) {
        visible = r * p.d + p.l <= t + 1;
      } else {
        visible = r <= t;
      }
      float prob = 0.0f, ds = 0.0f;
      const float gate = stats[3 * hh + 2];
      if (visible) {
        const int64_t key = (key_base + j) * G + g;
        float s, dp;
        if (compressed) {
          s = p.scale * dot_row(q + hh * dk, p.k_cmp + key * dk, dk);
          dp = gate * dot_row(d_o + hh * dv, p.v_cmp + key * dv, dv);
        } else {
          s = p.scale * dot_row(q + hh * dk, p.k[c] + key * dk, dk);
          dp = gate * dot_row(d_o + hh * dv, p.v[c] + key * dv, dv);
        }
        prob = expf(s - stats[3 * hh]);
        ds = prob * (dp - stats[3 * hh + 1]);
      }
      p_s[hh * rows + j] = prob * gate;
      ds_s[hh * rows + j] = p.scale * ds;
    }
    __syncthreads();
    // dV[j] += Σ_h p·g·dO_h,  dK[j] += Σ_h scale·ds·q_h (heads in ascending order).
    for (int64_t i = threadIdx.x; i < rows * dv; i += blockDim.x) {
      const int64_t j = i / dv, e = i % dv;
      float acc = dv_acc[i];
      for (int64_t hh = 0; hh < hpg; ++hh) acc += p_s[hh * rows + j] * d_o[hh * dv + e];
      dv_acc[i] = acc;
    }
    for (int64_t i = threadIdx.x; i < rows * dk; i += blockDim.x) {
      const int64_t j = i / dk, e = i % dk;
      float acc = dk_acc[i];
      for (int64_t hh = 0; hh < hpg; ++hh) acc += ds_s[hh * rows + j] * q[hh * dk + e];
      dk_acc[i] = acc;
    }
  }
  __syncthreads();
  // Chunked: write partial z (plain store); otherwise write or accumulate the result.
  float* dst_k = out_k + z * out_rows * G * dk;
  float* dst_v = out_v + z * out_rows * G * dv;
  const bool acc = chunks == 1 && accumulate;
  for (int64_t i = threadIdx.x; i < rows * dk; i += blockDim.x) {
    float* d = dst_k + ((key_base + i / dk) * G + g) * dk + i % dk;
    *d = acc ? *d + dk_acc[i] : dk_acc[i];
  }
  for (int64_t i = threadIdx.x; i < rows * dv; i += blockDim.x) {
    float* d = dst_v + ((key_base + i / dv) * G + g) * dv + i % dv;
    *d = acc ? *d + dv_acc[i] : dv_acc[i];
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

template <DkdvBranch kBranch>
void launch_branch(const NsaParams& p, const DkdvUnit* units, int64_t n_units, int64_t unit_rows,
                   int64_t chunks, float* out_k, float* out_v, int64_t out_rows, bool accumulate,
                   float* partial, cudaStream_t stream) {
  if (n_units == 0) return;
  const size_t smem = static_cast<size_t>(dkdv_smem(p, unit_rows).total_floats) * sizeof(float);
  NSA_CHECK(smem <= kMaxSmemBytes, "CUDA NSA backward (dK/dV) needs ", smem,
            " bytes of shared memory for units of ", unit_rows, " rows");
  NSA_CUDA_CHECK(cudaFuncSetAttribute(
      dkdv_kernel<kBranch>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  const dim3 grid(static_cast<unsigned>(n_units), static_cast<unsigned>(p.G),
                  static_cast<unsigned>(chunks));
  if (chunks == 1) {
    dkdv_kernel<kBranch><<<grid, kThreads, smem, stream>>>(p, units, unit_rows, 1, out_k, out_v,
                                                           out_rows, accumulate);
    NSA_CUDA_LAUNCH_CHECK();
    return;
  }
  const int64_t nk = out_rows * p.G * p.dk, nv = out_rows * p.G * p.dv;
  float* partial_v = partial + chunks * nk;
  dkdv_kernel<kBranch><<<grid, kThreads, smem, stream>>>(p, units, unit_rows, chunks, partial,
                                                         partial_v, out_rows, false);
  NSA_CUDA_LAUNCH_CHECK();
  sum_chunks_kernel<<<static_cast<unsigned>((nk + 255) / 256), 256, 0, stream>>>(
      partial, out_k, nk, chunks, accumulate);
  NSA_CUDA_LAUNCH_CHECK();
  sum_chunks_kernel<<<static_cast<unsigned>((nv + 255) / 256), 256, 0, stream>>>(
      partial_v, out_v, nv, chunks, accumulate);
  NSA_CUDA_LAUNCH_CHECK();
}

}  // namespace

void launch_nsa_backward_dkdv(const NsaParams& p, DkdvBranch branch, const DkdvUnit* units,
                              int64_t n_units, int64_t unit_rows, int64_t chunks, bool accumulate,
                              float* partial, cudaStream_t stream) {
  switch (branch) {
    case DkdvBranch::kWindow:
      launch_branch<DkdvBranch::kWindow>(p, units, n_units, unit_rows, chunks, p.d_k[2], p.d_v[2],
                                         p.T, accumulate, partial, stream);
      break;
    case DkdvBranch::kSelected:
      launch_branch<DkdvBranch::kSelected>(p, units, n_units, unit_rows, chunks, p.d_k[1], p.d_v[1],
                                           p.T, accumulate, partial, stream);
      break;
    case DkdvBranch::kCompressed:
      launch_branch<DkdvBranch::kCompressed>(p, units, n_units, unit_rows, chunks, p.d_k_cmp,
                                             p.d_v_cmp, p.C, accumulate, partial, stream);
      break;
  }
}

}  // namespace nsa::cuda
