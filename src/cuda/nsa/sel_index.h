// Inverted selection index: for each (group, selection block), the (query row, slot) entries that
// selected it, ascending (see sel_index.cu). Owns its device buffers; rebuilt by each backward.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/device_buffer.h"
#include "nsa_params.h"

namespace nsa::cuda {

class SelIndex {
 public:
  // Reads p.sel_idx (and the layout fields of p).
  void build(const NsaParams& p, cudaStream_t stream);
  // Points p.sel_entries / sel_seg_start / sel_seg_end at the index.
  void attach(NsaParams& p) const;
  size_t device_bytes() const {
    return keys_in_.bytes() + keys_out_.bytes() + seg_start_.bytes() + seg_end_.bytes() +
           temp_.bytes();
  }

 private:
  DeviceBuffer<uint64_t> keys_in_, keys_out_;
  DeviceBuffer<int64_t> seg_start_, seg_end_;
  DeviceBuffer<uint8_t> temp_;
};

}  // namespace nsa::cuda
