// The layout tables built on the device (see device_layout.h): a scan sanitises cu_seqlens and
// scans the per-sequence counts into offsets, a grid fills every table entry by a binary search
// over those offsets (layout_tables.h); one more kernel zeros compressed-gradient padding. Up to
// kFusedMaxSeqs sequences each CTA of the fill runs the scan itself into shared memory (one
// launch, no dependent step: the tables are rebuilt at the start of every pass of the C ABI);
// beyond, one single-CTA scan kernel runs first.
#include <cub/block/block_scan.cuh>

#include <algorithm>
#include <cstdint>

#include "common/cuda_check.h"
#include "device_layout.h"
#include "nsa_backward_dkdv.h"
#include "nsa_kernels.h"

namespace nsa::cuda {
namespace {

static_assert(layout::kTileRows == kQueryTileRows && layout::kTileRows == kDkdvUnitRows,
              "the device-built tables use the kernels' tile sizes");

constexpr int kScanThreads = 512;
constexpr int kThreads = 256;
// The fused build's shared arrays: cu_seqlens and the five offset arrays, N + 1 entries each.
constexpr int kFusedArrays = 6;
constexpr int kFusedMaxSeqs = 512;

__host__ __device__ int64_t max64(int64_t a, int64_t b) {
  return a > b ? a : b;
}

struct MaxOp {
  __device__ int64_t operator()(int64_t a, int64_t b) const { return max64(a, b); }
};
struct AddCounts {
  __device__ layout::SeqCounts operator()(const layout::SeqCounts& a,
                                          const layout::SeqCounts& b) const {
    return a + b;
  }
};

__device__ void store_offsets(const DeviceLayout& L, int64_t n, const layout::SeqCounts& c) {
  L.tile_offsets[n] = c.row_tiles;
  L.sel_unit_offsets[n] = c.sel_units;
  L.cmp_unit_offsets[n] = c.cmp_units;
  L.cmp_offsets[n] = c.cmp;
  L.blk_offsets[n] = c.blocks;
}

using MaxScan = cub::BlockScan<int64_t, kScanThreads>;
using CountScan = cub::BlockScan<layout::SeqCounts, kScanThreads>;
union ScanTemp {
  typename MaxScan::TempStorage max;
  typename CountScan::TempStorage counts;
};

// One CTA of kScanThreads writes L's cu_seqlens and offset arrays (wherever they point: global or
// shared memory): thread t owns a contiguous run of cu_seqlens entries (then of sequences); block
// scans carry the running maximum of the raw entries and the per-sequence counts across threads.
__device__ void scan_layout(layout::Hyper h, const int64_t* __restrict__ raw_cu,
                            const DeviceLayout& L, ScanTemp& tmp) {
  const int64_t N = L.N, T = L.T;
  const auto raw = [&](int64_t e) { return raw_cu ? raw_cu[e] : e * (T / N); };

  const int64_t per_entry = (N + 1 + kScanThreads - 1) / kScanThreads;
  const int64_t e0 = threadIdx.x * per_entry, e1 = layout::min64(e0 + per_entry, N + 1);
  int64_t local_max = INT64_MIN;
  for (int64_t e = e0; e < e1; ++e) local_max = max64(local_max, raw(e));
  int64_t running = INT64_MIN;
  MaxScan(tmp.max).ExclusiveScan(local_max, running, INT64_MIN, MaxOp());
  for (int64_t e = e0; e < e1; ++e) {
    const int64_t x = raw(e);
    L.cu_seqlens[e] = layout::sanitized_cu_entry(x, running, e, N, T);
    running = max64(running, x);
  }
  __syncthreads();  // cu_seqlens complete and visible to the block; tmp free for the next scan

  const int64_t per_seq = (N + kScanThreads - 1) / kScanThreads;
  const int64_t n0 = threadIdx.x * per_seq, n1 = layout::min64(n0 + per_seq, N);
  layout::SeqCounts local{};
  for (int64_t n = n0; n < n1; ++n) {
    local = local + layout::seq_counts(h, L.cu_seqlens[n + 1] - L.cu_seqlens[n]);
  }
  layout::SeqCounts before{}, total{};
  CountScan(tmp.counts).ExclusiveScan(local, before, layout::SeqCounts{}, AddCounts(), total);
  for (int64_t n = n0; n < n1; ++n) {
    store_offsets(L, n, before);
    before = before + layout::seq_counts(h, L.cu_seqlens[n + 1] - L.cu_seqlens[n]);
  }
  if (threadIdx.x == 0) store_offsets(L, N, total);
}

__global__ void __launch_bounds__(kScanThreads)
    scan_kernel(layout::Hyper h, const int64_t* __restrict__ raw_cu, DeviceLayout L) {
  __shared__ ScanTemp tmp;
  scan_layout(h, raw_cu, L, tmp);
}

__device__ RowTile row_tile(const layout::Tile& t) {
  return RowTile{static_cast<int32_t>(t.seq), static_cast<int32_t>(t.rows), t.first};
}

// Every table entry of L from its (sanitised) cu_seqlens and offsets.
__device__ void fill_tables(layout::Hyper h, const DeviceLayout& L) {
  const int64_t N = L.N;
  const layout::Capacities& c = L.caps;
  const int64_t n = max64(max64(L.T, c.cmp), max64(c.row_tiles, max64(c.sel_units, c.cmp_units)));
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    if (i < L.T) {
      L.seq_of_row[i] = static_cast<int32_t>(layout::seq_of_row_entry(L.cu_seqlens, N, i));
    }
    if (i < c.cmp) {
      L.cmp_raw_start[i] = layout::cmp_raw_start_entry(h, L.cu_seqlens, L.cmp_offsets, N, i);
    }
    if (i < c.row_tiles) {
      L.row_tiles[i] = row_tile(layout::tile_entry(L.cu_seqlens, L.tile_offsets, N, i));
    }
    if (i < c.sel_units) {
      L.sel_units[i] = row_tile(layout::sel_unit_entry(h, L.cu_seqlens, L.sel_unit_offsets, N, i));
    }
    if (i < c.cmp_units) {
      L.cmp_units[i] = row_tile(layout::tile_entry(L.cmp_offsets, L.cmp_unit_offsets, N, i));
    }
  }
}

__global__ void fill_kernel(layout::Hyper h, DeviceLayout L) {
  fill_tables(h, L);
}

// The scan and the fill in one launch for N < kFusedMaxSeqs: each CTA scans into shared memory
// (the same arithmetic as scan_kernel, so the same tables), CTA 0 also stores the arrays.
__global__ void __launch_bounds__(kScanThreads)
    fused_kernel(layout::Hyper h, const int64_t* __restrict__ raw_cu, DeviceLayout L) {
  __shared__ ScanTemp tmp;
  __shared__ int64_t arrays[kFusedArrays][kFusedMaxSeqs];
  // The scanned arrays, one list for both copies: S's point into shared memory, L's are global.
  int64_t* DeviceLayout::*const scanned[kFusedArrays] = {
      &DeviceLayout::cu_seqlens,       &DeviceLayout::cmp_offsets,
      &DeviceLayout::blk_offsets,      &DeviceLayout::tile_offsets,
      &DeviceLayout::sel_unit_offsets, &DeviceLayout::cmp_unit_offsets};
  DeviceLayout S = L;
  for (int a = 0; a < kFusedArrays; ++a) S.*scanned[a] = arrays[a];
  scan_layout(h, raw_cu, S, tmp);
  __syncthreads();
  if (blockIdx.x == 0) {
    for (int a = 0; a < kFusedArrays; ++a) {
      for (int64_t e = threadIdx.x; e <= L.N; e += blockDim.x) (L.*scanned[a])[e] = arrays[a][e];
    }
  }
  fill_tables(h, S);
}

__global__ void zero_padding_kernel(const int64_t* __restrict__ cmp_offsets, int64_t N,
                                    float* __restrict__ d_cmp, int64_t rows, int64_t row_elems) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= rows * row_elems) return;
  if (idx / row_elems >= cmp_offsets[N]) d_cmp[idx] = 0.0f;
}

layout::Hyper hyper(const NsaConfig& cfg) {
  return {cfg.l, cfg.d, cfg.l_sel};
}

}  // namespace

DeviceLayout carve_device_layout(const NsaConfig& cfg, int64_t T, int64_t N, Workspace& ws) {
  NSA_CHECK(N >= 1, "cu_seqlens must describe at least one sequence (num_seqs = ", N, ")");
  NSA_CHECK(T >= 0 && T < (int64_t{1} << 31), "total tokens T = ", T,
            " must be in [0, 2^31) for the kernels' 32-bit row fields");
  DeviceLayout L;
  L.T = T, L.N = N;
  L.caps = layout::capacities(hyper(cfg), T, N);
  L.cu_seqlens = ws.take<int64_t>(N + 1);
  L.cmp_offsets = ws.take<int64_t>(N + 1);
  L.blk_offsets = ws.take<int64_t>(N + 1);
  L.tile_offsets = ws.take<int64_t>(N + 1);
  L.sel_unit_offsets = ws.take<int64_t>(N + 1);
  L.cmp_unit_offsets = ws.take<int64_t>(N + 1);
  L.seq_of_row = ws.take<int32_t>(T);
  L.cmp_raw_start = ws.take<int64_t>(L.caps.cmp);
  L.row_tiles = ws.take<RowTile>(L.caps.row_tiles);
  L.sel_units = ws.take<RowTile>(L.caps.sel_units);
  L.cmp_units = ws.take<RowTile>(L.caps.cmp_units);
  return L;
}

void launch_build_device_layout(const NsaConfig& cfg, const DeviceLayout& L,
                                const int64_t* cu_seqlens, cudaStream_t stream) {
  NSA_CHECK(cu_seqlens || L.T % L.N == 0, "without cu_seqlens the ", L.T,
            " tokens must split into ", L.N, " sequences of equal length");
  const layout::Capacities& c = L.caps;
  const int64_t n = std::max({L.T, c.cmp, c.row_tiles, c.sel_units, c.cmp_units});
  if (L.N < kFusedMaxSeqs) {  // one launch; at least one CTA, which stores the arrays
    const int64_t blocks = std::clamp<int64_t>((n + kScanThreads - 1) / kScanThreads, 1, 2048);
    fused_kernel<<<static_cast<unsigned>(blocks), kScanThreads, 0, stream>>>(hyper(cfg), cu_seqlens,
                                                                             L);
    NSA_CUDA_LAUNCH_CHECK();
    return;
  }
  scan_kernel<<<1, kScanThreads, 0, stream>>>(hyper(cfg), cu_seqlens, L);
  NSA_CUDA_LAUNCH_CHECK();
  if (n == 0) return;
  const int64_t blocks = std::min<int64_t>((n + kThreads - 1) / kThreads, 4096);
  fill_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(hyper(cfg), L);
  NSA_CUDA_LAUNCH_CHECK();
}

void attach_device_layout(NsaParams& p, const DeviceLayout& L) {
  p.num_seqs = L.N, p.C = L.caps.cmp, p.TB = L.caps.blocks, p.max_len = L.T;
  p.cu_seqlens = L.cu_seqlens, p.cmp_offsets = L.cmp_offsets, p.blk_offsets = L.blk_offsets;
  p.seq_of_row = L.seq_of_row, p.cmp_raw_start = L.cmp_raw_start;
}

void launch_zero_compressed_padding(const NsaParams& p, const DeviceLayout& L, float* d_cmp,
                                    int64_t D, cudaStream_t stream) {
  const int64_t n = L.caps.cmp * p.G * D;
  if (n == 0) return;
  zero_padding_kernel<<<static_cast<unsigned>((n + kThreads - 1) / kThreads), kThreads, 0,
                        stream>>>(L.cmp_offsets, L.N, d_cmp, L.caps.cmp, p.G * D);
  NSA_CUDA_LAUNCH_CHECK();
}

}  // namespace nsa::cuda
