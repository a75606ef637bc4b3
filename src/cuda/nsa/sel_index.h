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
// Keys of the form (group·TB + block) << 32 | low bits (this index's and the block-major
// forward's) are sorted on bits [0, sel_key_end_bit(p)): the padding key's are all ones there,
// above every valid segment.
int sel_key_end_bit(const NsaParams& p);
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
