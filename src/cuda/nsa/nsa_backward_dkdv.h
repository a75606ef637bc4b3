// Key-centric dK/dV of the three NSA branches on tensor cores, and the selected branch's dq fused
// into its dK/dV pass (see nsa_backward_dkdv.cu).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "nsa_params.h"

namespace nsa::cuda {

// Key rows per unit (one CTA): 64 raw rows, compressed tokens, or rows of one selection block.
constexpr int64_t kDkdvUnitRows = 64;

// units: RowTiles of at most kDkdvUnitRows key rows (selected branch: within one block).
// partial: chunks·out_rows·G·(dk + dv) floats when chunks > 1 (else unused).
void launch_nsa_backward_dkdv(const NsaParams& p, Branch branch, const RowTile* units,
                              int64_t n_units, int64_t chunks, bool accumulate, float* partial,
                              cudaStream_t stream);

// One pass of the selected branch's fused backward over the index entries of query rows
// [r0, r1): dK/dV into partial slots (z0 + z) % slots, z < chunks (stored on a slot's first use,
// added afterwards), and the rows' dq partials into dq_part (see SelBlockMajor::backward).
struct SelDqPass {
  int64_t r0, r1;
  bf16* dq_part;  // [r1 − r0, H, n_sel, ⌈l_sel / 64⌉, dk]
  int64_t z0, slots;
};
void launch_sel_dkdv_dq(const NsaParams& p, const RowTile* units, int64_t n_units, int64_t chunks,
                        const SelDqPass& pass, float* partial, cudaStream_t stream);

// A branch's dK/dV (=, or += with `accumulate`) Σ of `slots` partial slots, in slot order.
void launch_sum_dkdv_partials(const NsaParams& p, Branch branch, int64_t slots, bool accumulate,
                              const float* partial, cudaStream_t stream);

}  // namespace nsa::cuda
