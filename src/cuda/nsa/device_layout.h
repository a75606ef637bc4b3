// The layout tables of the NSA kernels (NsaParams' sequence fields and the RowTile grids), built on
// the device from a cu_seqlens that lives on the device, so that a caller whose sequence lengths
// are device data (PyTorch's varlen batches, CUDA graphs) never synchronises with the host.
//
// The host knows only T and N. Every table is sized by layout::capacities (bounds that hold for
// any lengths) and padded: table entries past the real count have rows = 0 (the kernels return at
// once), compressed tokens past the real count have cmp_raw_start = −1 (compression writes zeros
// there, nothing reads them). NsaParams then carries C and TB as those capacities: buffers of
// compressed K/V have layout::capacities().cmp rows. The arithmetic is layout_tables.h's.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/workspace.h"
#include "layout_tables.h"
#include "nsa/config.h"
#include "nsa_params.h"

namespace nsa::cuda {

struct DeviceLayout {
  int64_t T = 0, N = 0;
  layout::Capacities caps{};
  int64_t* cu_seqlens = nullptr;        // [N + 1], sanitised (layout::sanitized_cu_entry)
  int64_t* cmp_offsets = nullptr;       // [N + 1]
  int64_t* blk_offsets = nullptr;       // [N + 1]
  int64_t* tile_offsets = nullptr;      // [N + 1] per-sequence prefix sums of the row tiles,
  int64_t* sel_unit_offsets = nullptr;  // the selected branch's units
  int64_t* cmp_unit_offsets = nullptr;  // and the compressed branch's units
  int32_t* seq_of_row = nullptr;        // [T]
  int64_t* cmp_raw_start = nullptr;     // [caps.cmp]
  RowTile* row_tiles = nullptr;         // [caps.row_tiles]
  RowTile* sel_units = nullptr;         // [caps.sel_units]
  RowTile* cmp_units = nullptr;         // [caps.cmp_units]
};

// The tables of T tokens in N sequences, from ws. Throws nsa::Error when T does not fit the
// tables' 32-bit fields.
DeviceLayout carve_device_layout(const NsaConfig& cfg, int64_t T, int64_t N, Workspace& ws);

// Fills every table from cu_seqlens (device, N + 1 entries; null: N sequences of T / N tokens).
// Two kernels on `stream`, no host synchronisation.
void launch_build_device_layout(const NsaConfig& cfg, const DeviceLayout& L,
                                const int64_t* cu_seqlens, cudaStream_t stream);

// Points p's layout fields at L; p.C and p.TB become the capacities, p.max_len T.
void attach_device_layout(NsaParams& p, const DeviceLayout& L);

// Zeros rows [real count, capacity) of a compressed-token gradient [caps.cmp, G, D]: the dK/dV
// kernels write only real tokens, and φ = mlp's GEMMs run over all rows.
void launch_zero_compressed_padding(const NsaParams& p, const DeviceLayout& L, float* d_cmp,
                                    int64_t D, cudaStream_t stream);

}  // namespace nsa::cuda
