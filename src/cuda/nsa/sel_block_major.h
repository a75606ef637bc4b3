// The selected branch block-major (v3): forward and dq walk each selection block once per batch of
// the queries that chose it, instead of once per query (see sel_block_major.cu and docs/cuda.md).
//
// For a chunk of query rows, every valid (row, group, slot) of sel_idx becomes a 64-bit key
// (group·TB + global block) << 32 | (local row · n_sel + slot); a radix sort groups the keys by
// block. CTA b then takes sorted entries [b·NE, (b+1)·NE): it stages each block it meets once in
// shared memory and runs the (entry, head) pairs of its entries through it in 64-row MMA tiles,
// writing one partial result per (row, head, slot) – the block's softmax state (o, lse) in the
// forward, its dq contribution in the backward. A merge kernel then combines each (row, head)'s
// partials in slot order. No atomics: every partial is written once and merged in a fixed order.
// Rows are processed in chunks so that the partials stay within kSelPartialBudgetBytes.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/device_buffer.h"
#include "common/workspace.h"
#include "nsa_params.h"

namespace nsa::cuda {

// Device bytes the partial results of one chunk may take (rows per chunk follow from it).
constexpr int64_t kSelPartialBudgetBytes = int64_t{1} << 30;

// Which kernel computes the selected branch's forward and dq.
enum class SelectedKernel {
  kQueryMajor,  // v2: a warp per (query rows, group) over the union of their blocks
  kBlockMajor,  // v3: this file
};

// The largest selection block the block-major kernels stage whole in shared memory.
constexpr int64_t kSelBlockMajorMaxLsel = 256;

// Scratch of the block-major kernels – sort keys, cub's temporary storage, partial results –
// carved from a Workspace for one shape: `rows` query rows per chunk, so that the partials stay
// within the budget. Used only while one forward or backward call runs.
struct SelBlockMajorView {
  int64_t rows = 0;
  uint64_t* keys_in = nullptr;
  uint64_t* keys_out = nullptr;
  void* temp = nullptr;
  size_t temp_bytes = 0;
  float* part = nullptr;
  float* part_lse = nullptr;
};

SelBlockMajorView carve_sel_block_major(const NsaParams& p, int64_t partial_budget_bytes,
                                        Workspace& ws);
// grad = false: o_branch[1] and lse[1] from p.sel_idx (the forward's selected branch).
// grad = true: d_q += the selected branch's dq (p.d_q already holds the compressed branch's).
void run_sel_block_major(const NsaParams& p, const SelBlockMajorView& v, bool grad,
                         cudaStream_t stream);

// The scratch in memory of its own that grows to the largest shape seen (layers of one model
// share one).
class SelBlockMajor {
 public:
  void forward(const NsaParams& p, cudaStream_t stream) {
    run_sel_block_major(p, view(p), false, stream);
  }
  void backward_dq(const NsaParams& p, cudaStream_t stream) {
    run_sel_block_major(p, view(p), true, stream);
  }
  // Tests: a smaller budget forces many row chunks.
  void set_partial_budget(int64_t bytes) { budget_ = bytes; }
  int64_t partial_budget() const { return budget_; }
  // The scratch for p, growing the memory when p needs more.
  SelBlockMajorView view(const NsaParams& p);
  size_t device_bytes() const { return mem_.bytes(); }

 private:
  DeviceBuffer<unsigned char> mem_;
  int64_t budget_ = kSelPartialBudgetBytes;
};

}  // namespace nsa::cuda
