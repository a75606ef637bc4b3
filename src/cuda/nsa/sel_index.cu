// The inverted selection index (block → queries), built on the device from sel_idx so that the
// selected branch's dK/dV can be accumulated key-centrically without atomics.
//
// Each valid entry (row, g, block b of the row's sequence) becomes the 64-bit key
// ((g·TB + gb) << 32) | (row·n_sel + slot) with gb the global block id; padding (−1) becomes
// UINT64_MAX. A stable radix sort on the segment bits groups the keys by (group, block) with rows
// ascending, and one pass marks where each (group, block) segment starts and ends (empty segments
// keep start = end = 0). The block-major forward sorts its chunks' keys with the same functions.
// The memory comes from a Workspace (sel_index.h).
#include <cub/device/device_radix_sort.cuh>

#include "common/cuda_check.h"
#include "sel_index.h"

namespace nsa::cuda {
namespace {

__global__ void make_keys_kernel(const NsaParams p, int64_t r0, int64_t n,
                                 uint64_t* __restrict__ keys) {
  const int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= n) return;
  const int64_t ge = r0 * p.G * p.n_sel + e;
  const int64_t row = ge / (p.G * p.n_sel), g = (ge / p.n_sel) % p.G, slot = ge % p.n_sel;
  const int32_t b = p.sel_idx[ge];
  if (b < 0) {
    keys[e] = ~0ull;
    return;
  }
  const int64_t gb = p.blk_offsets[p.seq_of_row[row]] + b;
  keys[e] =
      (static_cast<uint64_t>(g * p.TB + gb) << 32) | static_cast<uint64_t>(row * p.n_sel + slot);
}

__global__ void mark_segments_kernel(const uint64_t* __restrict__ keys, int64_t n,
                                     int64_t* __restrict__ seg_start,
                                     int64_t* __restrict__ seg_end) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n || keys[i] == ~0ull) return;
  const uint64_t seg = keys[i] >> 32;
  if (i == 0 || (keys[i - 1] >> 32) != seg) seg_start[seg] = i;
  if (i == n - 1 || keys[i + 1] == ~0ull || (keys[i + 1] >> 32) != seg) seg_end[seg] = i + 1;
}

// One bit past the segment ids (G·TB of them) above bit 32.
int sel_key_end_bit(const NsaParams& p) {
  int end_bit = 32;
  while ((uint64_t{1} << (end_bit - 32)) <= static_cast<uint64_t>(p.G * p.TB)) ++end_bit;
  return end_bit;
}

}  // namespace

void launch_sel_keys(const NsaParams& p, int64_t r0, int64_t rows, uint64_t* keys,
                     cudaStream_t stream) {
  const int64_t n = rows * p.G * p.n_sel;
  if (n == 0) return;
  make_keys_kernel<<<static_cast<unsigned>((n + 255) / 256), 256, 0, stream>>>(p, r0, n, keys);
  NSA_CUDA_LAUNCH_CHECK();
}

size_t sel_sort_temp_bytes(const NsaParams& p, int64_t n) {
  size_t bytes = 0;
  if (n > 0) {
    NSA_CUDA_CHECK(cub::DeviceRadixSort::SortKeys(nullptr, bytes, static_cast<uint64_t*>(nullptr),
                                                  static_cast<uint64_t*>(nullptr),
                                                  static_cast<int>(n), 32, sel_key_end_bit(p)));
  }
  return bytes;
}

void sort_sel_keys(const NsaParams& p, const uint64_t* keys_in, uint64_t* keys_out, int64_t n,
                   void* temp, size_t temp_bytes, cudaStream_t stream) {
  if (n == 0) return;
  // temp_bytes came from sel_sort_temp_bytes for at least n keys (no second query on every call);
  // cub refuses a smaller buffer.
  NSA_CUDA_CHECK(cub::DeviceRadixSort::SortKeys(
      temp, temp_bytes, keys_in, keys_out, static_cast<int>(n), 32, sel_key_end_bit(p), stream));
}

SelIndexView carve_sel_index(const NsaParams& p, Workspace& ws) {
  const int64_t n = p.T * p.G * p.n_sel, segments = p.G * p.TB;
  NSA_CHECK(p.T * p.n_sel < (int64_t{1} << 32) && segments < (int64_t{1} << 31),
            "selection index: too many tokens or blocks for 32-bit fields");
  SelIndexView v;
  v.keys_in = ws.take<uint64_t>(n);
  v.keys_out = ws.take<uint64_t>(n);
  v.seg_start = ws.take<int64_t>(segments);
  v.seg_end = ws.take<int64_t>(segments);
  v.temp_bytes = sel_sort_temp_bytes(p, n);
  v.temp = ws.take_bytes(v.temp_bytes);
  return v;
}

void build_sel_index(const NsaParams& p, const SelIndexView& v, cudaStream_t stream) {
  const int64_t n = p.T * p.G * p.n_sel, segments = p.G * p.TB;
  if (segments > 0) {
    NSA_CUDA_CHECK(cudaMemsetAsync(v.seg_start, 0, sizeof(int64_t) * segments, stream));
    NSA_CUDA_CHECK(cudaMemsetAsync(v.seg_end, 0, sizeof(int64_t) * segments, stream));
  }
  if (n == 0) return;
  launch_sel_keys(p, 0, p.T, v.keys_in, stream);
  sort_sel_keys(p, v.keys_in, v.keys_out, n, v.temp, v.temp_bytes, stream);
  mark_segments_kernel<<<static_cast<unsigned>((n + 255) / 256), 256, 0, stream>>>(
      v.keys_out, n, v.seg_start, v.seg_end);
  NSA_CUDA_LAUNCH_CHECK();
}

void attach_sel_index(NsaParams& p, const SelIndexView& v) {
  p.sel_entries = v.keys_out;
  p.sel_seg_start = v.seg_start;
  p.sel_seg_end = v.seg_end;
}

SelIndexView SelIndex::view(const NsaParams& p) {
  Workspace sizing = Workspace::sizing();
  carve_sel_index(p, sizing);
  if (static_cast<int64_t>(sizing.used()) > mem_.size()) mem_.resize(sizing.used());
  Workspace ws(mem_.get(), mem_.bytes());
  return carve_sel_index(p, ws);
}

}  // namespace nsa::cuda
