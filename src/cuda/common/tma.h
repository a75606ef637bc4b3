// Tensor maps for the bulk tensor copy engine (TMA, Hopper): the host half. A map describes rows of
// D bf16 elements laid out [rows, G, D] (a group's rows are G·D apart, as our K/V tensors are) and
// a box of 64 columns × box_rows rows of one group, landing in shared memory with the 128-byte
// swizzle of common/wgmma.cuh – the layout the warpgroup-MMA kernels read. Rows past `rows` arrive
// as zeros. The encoder is the driver's cuTensorMapEncodeTiled, looked up through the runtime (no
// link to libcuda, so binaries still load on machines without a driver). tma.cuh is the device
// half.
#pragma once

#include <cuda.h>

#include <cstdint>

namespace nsa::cuda {

// A map of `base` ([rows, G, D] bf16, 16-byte aligned, D a multiple of 64) with boxes of
// 64 columns × box_rows rows of one group; coordinates (column, group, row). rows == 0 or a null
// base gives a zeroed map (never to be used: no copy is issued for an empty range).
CUtensorMap make_group_rows_map(const void* base, int64_t rows, int64_t G, int64_t D, int box_rows);

// A map of `base` ([rows, width] bf16, 16-byte aligned, width a multiple of 8) with boxes of
// box_cols × box_rows elements; coordinates (column, row). swizzle_128b: the 128-byte swizzle
// (box_cols = 64), else none – and then a box may reach past the width: those columns arrive as
// zeros, which gives a padded row (the decode parts' value rows). rows == 0 or a null base gives a
// zeroed map.
CUtensorMap make_row_box_map(const void* base, int64_t rows, int64_t width, int box_cols,
                             int box_rows, bool swizzle_128b);

}  // namespace nsa::cuda
