// The tensor maps (common/tma.h) of the dense branches' K/V, by which the warpgroup-MMA forward and
// dq kernels copy their 64-key tiles with the bulk tensor copy engine: one 64-column box per
// sub-tile, issued by one thread (wgmma_tiles.cuh, TmaKvPipeline). Built on the host for every
// launch from the pointers in NsaParams; passed to the kernels by value.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include "nsa_params.h"

namespace nsa::cuda {

struct DenseKvMaps {
  CUtensorMap k[2],
      v[2];  // [0] the compressed K/V (bf16 copies, C rows), [1] the window's (T rows)
};

__host__ __device__ constexpr int dense_map_index(Branch b) {
  return b == Branch::kCmp ? 0 : 1;
}

// Maps with boxes of key_rows rows; only for head dims that are multiples of 64 (wgmma_dims).
DenseKvMaps make_dense_kv_maps(const NsaParams& p, int key_rows);

}  // namespace nsa::cuda
