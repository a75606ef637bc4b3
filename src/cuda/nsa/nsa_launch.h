// The launch order of one NSA forward and one backward on one stream (docs/cuda.md), shared by
// NsaCudaLayer (tables and scratch in buffers of its own) and the C ABI (tables built on the
// device, scratch in the caller's workspace), so that both run exactly the same kernels in the same
// order.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "common/stream_fork.h"
#include "compress_mlp.h"
#include "device_layout.h"
#include "nsa/config.h"
#include "nsa_kernels.h"
#include "nsa_params.h"
#include "sel_block_major.h"
#include "sel_index.h"

namespace nsa::cuda {

// CTAs per dK/dV unit, each adding up a share of the unit's queries into a partial sum (the
// partials are then added in chunk order). The compressed branch has few units (one per 64
// compressed tokens) and the first see nearly every query; the selected branch's first blocks are
// hot (block 0 is forced for every query); the window's units are many and even.
constexpr int64_t kCmpChunks = 64, kSelChunks = 16, kWinChunks = 2;

// The window's chunks per unit: 1 from 1024 unit CTAs (⌈T / 64⌉ units with the groups) on – no
// partials to add up; below, kWinChunks where that fills the last wave better (counted in units of
// a one-chunk CTA's work, at dkdv_ctas_per_sm per SM), else 1. Counted from T alone, not from a
// table's length, so that host-built tables and the C ABI's device-built ones (whose length is a
// capacity) pick the same count – and the same bits. Measured (H100, docs/perf.md):
// kernel alone (nsa_workshop dkdv_win:1 / :2) m7c_125m 16k (512 unit CTAs: 1.3 waves or 2.6 half
// waves) 0.281 / 0.257 ms, 64k (2048) 0.810 / 0.885, paper_attn 16k (1024) 3.131 / 3.313; the
// backward (layer_bwd, two chunks / one) m7c_125m 4k (128: 0.32 waves) 0.431 / 0.456, 8k (256:
// 0.65 waves or 1.3 half waves) 0.818 / 0.793.
int64_t win_dkdv_chunks(const NsaParams& p);

// Floats of the dK/dV partial sums for p's sizes.
int64_t dkdv_partial_floats(const NsaParams& p);

// The kernels' grids: 64-row query tiles (also the window's dK/dV units), selection-block units,
// compressed-token units (see nsa_backward_dkdv.h); entries with rows = 0 are skipped.
struct NsaTables {
  const RowTile* row_tiles = nullptr;
  int64_t n_row_tiles = 0;
  const RowTile* sel_units = nullptr;
  int64_t n_sel_units = 0;
  const RowTile* cmp_units = nullptr;
  int64_t n_cmp_units = 0;
};

// Everything else a launch sequence uses besides NsaParams.
struct NsaScratch {
  SelectedKernel sel_kernel = SelectedKernel::kBlockMajor;
  SelectQ select_q = SelectQ::kAuto;  // the selection's Q rows (nsa_kernels.h)
  // Block-major only (null: one stream). Forward: the window branch on fork->side() beside the
  // compression, selection and selected branch. Backward (separate K/V): the selected branch's
  // chain on the side beside the dense branches'. Every buffer keeps one writer order: results
  // are identical to one stream's.
  const StreamFork* fork = nullptr;
  SelBlockMajorView sel_block_major;       // the block-major kernel's scratch
  SelIndexView sel_index;                  // backward: the inverted selection index
  float* partial = nullptr;                // backward: dkdv_partial_floats(p) floats
  const CompressMlpArgs* mlp_k = nullptr;  // φ = mlp: both set
  const CompressMlpArgs* mlp_v = nullptr;
  cublasHandle_t blas = nullptr;  // φ = mlp
  // Tables built on the device (padded compressed tokens): the backward zeros the padding rows of
  // the compressed K/V gradient before φ = mlp's GEMMs read them.
  const DeviceLayout* device_layout = nullptr;
};

// Compression, compressed branch, block selection, selected branch, window branch (which also
// writes o).
void launch_nsa_forward(const NsaParams& p, const NsaTables& t, const NsaScratch& s,
                        cudaStream_t stream);

// For a backward that does not follow its forward's scratch (the C ABI keeps only the forward's
// outputs): the bf16 copies of the compressed K/V from p.k_cmp / p.v_cmp and, for φ = mlp, the
// MLPs' activations.
void launch_nsa_backward_recompute(const NsaParams& p, const NsaScratch& s, cudaStream_t stream);

// Preprocess → dq of the compressed branch (writes d_q), then of the window (adds; query-major: the
// selected branch's before it) → selection index (attached to p) → dK/dV window (writes) →
// selected (writes, or adds when K/V are shared; block-major: with its dq, added to d_q) →
// compressed → φ backward into the raw cmp K/V gradient (writes, or adds when shared).
void launch_nsa_backward(const NsaConfig& cfg, NsaParams& p, const NsaTables& t,
                         const NsaScratch& s, cudaStream_t stream);

}  // namespace nsa::cuda
