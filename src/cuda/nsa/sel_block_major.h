// The selected branch block-major (v3): the forward walks each selection block once per batch of
// the queries that chose it, instead of once per query (see sel_block_major.cu and docs/cuda.md);
// the backward runs the selected dK/dV with dq fused into it and merges the dq partials.
//
// Forward: for a chunk of query rows, every valid (row, group, slot) of sel_idx becomes a 64-bit
// key (group·TB + global block) << 32 | (local row · n_sel + slot); a radix sort groups the keys by
// block. CTA b then takes sorted entries [b·NE, (b+1)·NE): it stages each block it meets once in
// shared memory and runs the (entry, head) pairs of its entries through it in 64-row MMA tiles,
// writing one partial softmax state (o, lse) per (row, head, slot). A merge kernel then combines
// each (row, head)'s partials in slot order. Backward: the inverted selection index (SelIndex)
// drives the selected dK/dV kernel, which also writes one dq partial per (row, head, slot, 64-row
// unit of the block); a merge adds them to d_q in order. No atomics: every partial is written once
// and merged in a fixed order. Rows are processed in chunks (passes) so that the partials stay
// within kSelPartialBudgetBytes.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/device_buffer.h"
#include "common/workspace.h"
#include "nsa_backward_dkdv.h"
#include "nsa_params.h"

namespace nsa::cuda {

// Device bytes the partial results of one chunk may take (rows per chunk follow from it).
constexpr int64_t kSelPartialBudgetBytes = int64_t{1} << 30;

// Partial-result bytes per query row (the larger of the forward's and the backward's).
int64_t sel_partial_bytes_per_row(int64_t H, int64_t n_sel, int64_t l_sel, int64_t dk, int64_t dv);

// Which kernel computes the selected branch's forward and dq.
enum class SelectedKernel {
  kQueryMajor,  // v2: a warp per (query rows, group) over the union of their blocks
  kBlockMajor,  // v3: this file
};

// The largest selection block the block-major kernels stage whole in shared memory.
constexpr int64_t kSelBlockMajorMaxLsel = 256;

// Scratch of the block-major kernels – sort keys, cub's temporary storage, partial results, the
// backward's work items – carved from a Workspace for one shape: `rows` query rows per chunk, so
// that the partials stay within the budget. Used only while one forward or backward call runs.
struct SelBlockMajorView {
  int64_t rows = 0;
  uint64_t* keys_in = nullptr;
  uint64_t* keys_out = nullptr;
  void* temp = nullptr;
  size_t temp_bytes = 0;
  bf16* part = nullptr;  // forward o partials, or the backward's dq partials
  float* part_lse = nullptr;
  int64_t n_units = 0;  // selection units the backward's item arrays were carved for
  int64_t* counts = nullptr;
  int64_t* item_end = nullptr;
  void* scan_temp = nullptr;
  size_t scan_temp_bytes = 0;
  float* item_part = nullptr;
  SelItemDesc* items = nullptr;
};

// n_sel_units: the selected branch's dK/dV units (table entries, padding included).
SelBlockMajorView carve_sel_block_major(const NsaParams& p, int64_t partial_budget_bytes,
                                        int64_t n_sel_units, Workspace& ws);
// o_branch[1] and lse[1] from p.sel_idx (the forward's selected branch); with `combine` also o
// from the three branches (the window's o_branch[2] written before: merge_after, an event the
// first merge waits for when the window ran on another stream, or null).
void run_sel_block_major_forward(const NsaParams& p, const SelBlockMajorView& v,
                                 cudaStream_t stream, bool combine = false,
                                 cudaEvent_t merge_after = nullptr);
// Whether run_sel_block_major_backward writes the bf16 K/V gradient itself (so that no conversion
// follows): both bf16 destinations given, nothing to add to, and the rows in one pass.
bool sel_block_major_writes_bf16(const NsaParams& p, const SelBlockMajorView& v, bool accumulate);
// The selected branch's dK/dV (= or, with `accumulate`, += into p.d_k[1] / p.d_v[1]; straight
// into p.d_k_bf16[1] / p.d_v_bf16[1] where sel_block_major_writes_bf16) over the selection units,
// and d_q += its dq. Needs the inverted selection index attached to p.
// merge_after: an event the first d_q merge waits for (d_q written on another stream), or null;
// dkdv_done: an event recorded once the last dK/dV pass is issued (before the last merge), or null.
void run_sel_block_major_backward(const NsaParams& p, const SelBlockMajorView& v,
                                  const RowTile* units, int64_t n_units, bool accumulate,
                                  cudaStream_t stream, cudaEvent_t merge_after = nullptr,
                                  cudaEvent_t dkdv_done = nullptr);

// The scratch in memory of its own that grows to the largest shape seen (layers of one model
// share one).
class SelBlockMajor {
 public:
  // Tests: a smaller budget forces many row chunks.
  void set_partial_budget(int64_t bytes) { budget_ = bytes; }
  int64_t partial_budget() const { return budget_; }
  // The scratch for p, growing the memory when p needs more.
  SelBlockMajorView view(const NsaParams& p, int64_t n_sel_units);
  size_t device_bytes() const { return mem_.bytes(); }

 private:
  DeviceBuffer<unsigned char> mem_;
  int64_t budget_ = kSelPartialBudgetBytes;
};

}  // namespace nsa::cuda
