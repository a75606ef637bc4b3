// The inverted selection index (block → queries), built on the device from sel_idx so that the
// selected branch's dK/dV can be accumulated key-centrically without atomics.
//
// Each valid entry (row, g, block b of the row's sequence) becomes the 64-bit key
// ((g·TB + gb) << 32) | (row·n_sel + slot) with gb the global block id; padding (−1) becomes
// UINT64_MAX. A radix sort groups the keys by (group, block) with rows ascending, and one pass
// marks where each (group, block) segment starts and ends (empty segments keep start = end = 0).
#include <cub/device/device_radix_sort.cuh>

#include "common/cuda_check.h"
#include "sel_index.h"

namespace nsa::cuda {
namespace {

__global__ void make_keys_kernel(const NsaParams p, uint64_t* __restrict__ keys) {
  const int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= p.T * p.G * p.n_sel) return;
  const int64_t row = e / (p.G * p.n_sel), g = (e / p.n_sel) % p.G, slot = e % p.n_sel;
  const int32_t b = p.sel_idx[e];
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

}  // namespace

void SelIndex::build(const NsaParams& p, cudaStream_t stream) {
  const int64_t n = p.T * p.G * p.n_sel, segments = p.G * p.TB;
  NSA_CHECK(p.T * p.n_sel < (int64_t{1} << 32) && segments < (int64_t{1} << 31),
            "selection index: too many tokens or blocks for 32-bit fields");
  keys_in_.resize(n);
  keys_out_.resize(n);
  seg_start_.resize(segments);
  seg_end_.resize(segments);
  seg_start_.zero(stream);
  seg_end_.zero(stream);
  if (n == 0) return;
  make_keys_kernel<<<static_cast<unsigned>((n + 255) / 256), 256, 0, stream>>>(p, keys_in_.get());
  NSA_CUDA_LAUNCH_CHECK();
  // Sort on the bits in use: the padding key's are all ones there, above every valid segment.
  int end_bit = 32;
  while ((uint64_t{1} << (end_bit - 32)) <= static_cast<uint64_t>(segments)) ++end_bit;
  size_t temp_bytes = 0;
  NSA_CUDA_CHECK(cub::DeviceRadixSort::SortKeys(nullptr, temp_bytes, keys_in_.get(),
                                                keys_out_.get(), static_cast<int>(n), 0, end_bit,
                                                stream));
  temp_.resize(static_cast<int64_t>(temp_bytes));
  NSA_CUDA_CHECK(cub::DeviceRadixSort::SortKeys(temp_.get(), temp_bytes, keys_in_.get(),
                                                keys_out_.get(), static_cast<int>(n), 0, end_bit,
                                                stream));
  mark_segments_kernel<<<static_cast<unsigned>((n + 255) / 256), 256, 0, stream>>>(
      keys_out_.get(), n, seg_start_.get(), seg_end_.get());
  NSA_CUDA_LAUNCH_CHECK();
}

void SelIndex::attach(NsaParams& p) const {
  p.sel_entries = keys_out_.get();
  p.sel_seg_start = seg_start_.get();
  p.sel_seg_end = seg_end_.get();
}

}  // namespace nsa::cuda
