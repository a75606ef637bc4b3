// Key-centric dK/dV of the three NSA branches on tensor cores, and the selected branch's dq fused
// into its dK/dV pass (see nsa_backward_dkdv.cu).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "nsa_params.h"

namespace nsa::cuda {

// Key rows per unit (one CTA): 64 raw rows, compressed tokens, or rows of one selection block.
constexpr int64_t kDkdvUnitRows = 64;

// Resident dK/dV CTAs per SM the kernels are built for: up to 64-wide heads the accumulators fit
// in 168 registers, three CTAs per SM instead of two; wider heads take what fits.
__host__ __device__ constexpr int dkdv_ctas_per_sm(int64_t dk) {
  return dk <= 64 ? 3 : 1;
}

// Units per selection block: ⌈l_sel / 64⌉.
__host__ __device__ constexpr int64_t sel_units_per_block(int64_t l_sel) {
  return (l_sel + kDkdvUnitRows - 1) / kDkdvUnitRows;
}

// units: RowTiles of at most kDkdvUnitRows key rows (selected branch: within one block).
// partial: chunks·out_rows·G·(dk + dv) floats when chunks > 1 (else unused). The window's and the
// selected branch's gradient go to p.d_k_bf16 / p.d_v_bf16 of the branch instead of p.d_k / p.d_v
// where those are set (the caller sets them only where this pass is the gradient's last writer).
void launch_nsa_backward_dkdv(const NsaParams& p, Branch branch, const RowTile* units,
                              int64_t n_units, int64_t chunks, bool accumulate, float* partial,
                              cudaStream_t stream);

// The selected branch's fused backward (dK/dV and dq in one pass over the inverted index), run in
// passes over query rows [r0, r1) so that the dq partials stay bounded
// (run_sel_block_major_backward). Work is cut into items of at most sel_entries_per_item index
// entries of one (unit, group), so a hot block (block 0 is every query's) spreads over many CTAs
// and a cold one takes one: a unit's only item writes its dK/dV to the gradient directly, several
// items write partials that a second kernel sums in item order (SelGradOut: stored, or added to
// p.d_k[1] / p.d_v[1]; in bf16 instead where given). Rows no item writes keep what the gradient
// held: zero it (fp32 or bf16) before the first pass. dq partials: unscaled Σ_j dS_j k_j per (row,
// head, slot, 64-row unit ub of the block) at dq_part[(((row − r0)·H + head)·n_sel + slot)·⌈l_sel /
// 64⌉ + ub], bf16, dk wide.
struct SelDqPass {
  int64_t r0, r1;
  bf16* dq_part;
};
// Where a pass's dK/dV go: added to p.d_k[1] / p.d_v[1] (accumulate) or stored there; with k16 /
// v16 stored into those in bf16 instead (rounded from the fp32 value, which is then not written) –
// only for a pass that is the gradient's last writer.
struct SelGradOut {
  bool accumulate = false;
  bf16* k16 = nullptr;
  bf16* v16 = nullptr;
};
// Pairs ((entry, head)) per work item.
constexpr int64_t kSelItemPairs = 1024;
int64_t sel_entries_per_item(const NsaParams& p);
// Work items of a pass of `rows` query rows, at most.
int64_t sel_items_bound(const NsaParams& p, int64_t n_units, int64_t rows);
// Scratch of one pass: item counts and their prefix sum (n_units·G each), the scan's temporary
// storage (sel_scan_temp_bytes(n_units·G)), the items' partials (bound·64·(dk + dv) floats) and
// descriptors (bound).
// A work item: index entries [qa, qb) of (unit, group) ug, written by a small kernel after the
// prefix sum so that an item's CTA starts with one load instead of a chain of binary searches.
struct SelItemDesc {
  int64_t qa, qb, ug;
};
struct SelItemScratch {
  int64_t* counts;
  int64_t* item_end;
  void* scan_temp;
  size_t scan_temp_bytes;
  float* part;
  SelItemDesc* items;  // sel_items_bound entries
};
size_t sel_scan_temp_bytes(int64_t n);
void launch_sel_dkdv_dq(const NsaParams& p, const RowTile* units, int64_t n_units,
                        const SelDqPass& pass, const SelGradOut& out, const SelItemScratch& scratch,
                        cudaStream_t stream);

}  // namespace nsa::cuda
