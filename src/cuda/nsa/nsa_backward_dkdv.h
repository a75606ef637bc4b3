// Key-centric dK/dV of the three NSA branches (see nsa_backward_dkdv.cu).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "nsa_params.h"

namespace nsa::cuda {

enum class DkdvBranch { kCompressed, kSelected, kWindow };

// One CTA's key rows: sequence, first row (raw row in the sequence, or compressed index), count.
struct DkdvUnit {
  int32_t seq;
  int32_t rows;
  int64_t first;
};

// partial: chunks·out_rows·G·(dk + dv) floats when chunks > 1 (else unused).
void launch_nsa_backward_dkdv(const NsaParams& p, DkdvBranch branch, const DkdvUnit* units,
                              int64_t n_units, int64_t unit_rows, int64_t chunks, bool accumulate,
                              float* partial, cudaStream_t stream);

}  // namespace nsa::cuda
