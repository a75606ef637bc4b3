// Inverted selection index: for each (group, selection block), the (query row, slot) entries that
// selected it, ascending (see sel_index.cu). Rebuilt by each backward.
//
// SelIndexView is the index's memory (keys, segment bounds, cub's temporary storage) carved from a
// Workspace, so that callers holding no buffers of their own (the C ABI) can build it; SelIndex
// owns one that grows to the largest shape it has seen (NsaCudaLayer).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/device_buffer.h"
#include "common/workspace.h"
#include "nsa_params.h"

namespace nsa::cuda {

struct SelIndexView {
  uint64_t* keys_in = nullptr;
  uint64_t* keys_out = nullptr;
  int64_t* seg_start = nullptr;
  int64_t* seg_end = nullptr;
  void* temp = nullptr;
  size_t temp_bytes = 0;
};

// The arrays of the index for p's sizes (T, G, n_sel, TB), taken from ws.
SelIndexView carve_sel_index(const NsaParams& p, Workspace& ws);
// The sort keys of sel_idx's entries of rows [r0, r0 + rows) (this index's, and a chunk of the
// block-major forward's): ((g·TB + gb) << 32) | (row·n_sel + slot), gb the global block id;
// padding (−1) becomes all ones. keys[e] is entry r0·G·n_sel + e: rows ascend with e.
void launch_sel_keys(const NsaParams& p, int64_t r0, int64_t rows, uint64_t* keys,
                     cudaStream_t stream);
// Bytes of cub's temporary storage for sort_sel_keys of n keys (a host-side query).
size_t sel_sort_temp_bytes(const NsaParams& p, int64_t n);
// Groups n keys by (group, block) segment: a stable radix sort on the segment bits only
// ([32, 32 + bits of G·TB]), so rows stay ascending within a segment as launch_sel_keys made
// them, in a third of the passes of a sort on all bits. The padding keys' segment bits are all
// ones, above every valid segment. temp holds temp_bytes >= sel_sort_temp_bytes(p, n).
void sort_sel_keys(const NsaParams& p, const uint64_t* keys_in, uint64_t* keys_out, int64_t n,
                   void* temp, size_t temp_bytes, cudaStream_t stream);
// Reads p.sel_idx (and the layout fields of p).
void build_sel_index(const NsaParams& p, const SelIndexView& v, cudaStream_t stream);
// Points p.sel_entries / sel_seg_start / sel_seg_end at the index.
void attach_sel_index(NsaParams& p, const SelIndexView& v);

// The index in memory of its own that grows to the largest shape seen.
class SelIndex {
 public:
  // The index's arrays for p, growing the memory when p needs more.
  SelIndexView view(const NsaParams& p);
  size_t device_bytes() const { return mem_.bytes(); }

 private:
  DeviceBuffer<unsigned char> mem_;
};

}  // namespace nsa::cuda
