// Key-centric dK/dV of the three NSA branches on tensor cores (see nsa_backward_dkdv.cu).
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

}  // namespace nsa::cuda
