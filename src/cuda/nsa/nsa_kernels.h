// Launchers of the NSA CUDA kernels (raw pointers in NsaParams + a stream; grid math and launch
// checks inside). The validated entry point is NsaCudaLayer (nsa_cuda_layer.h).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "common/cuda_check.h"
#include "nsa_params.h"

namespace nsa::cuda {

// Opt-in shared memory per block on Hopper (227 KiB).
constexpr size_t kMaxSmemBytes = 227 * 1024;

// Query rows per RowTile of the forward, selection and dq grids.
constexpr int64_t kQueryTileRows = 64;

template <typename Kernel>
void set_kernel_smem(Kernel kernel, size_t bytes) {
  NSA_CHECK(bytes <= kMaxSmemBytes, "CUDA NSA kernel needs ", bytes,
            " bytes of shared memory (limit ", kMaxSmemBytes, ")");
  NSA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      static_cast<int>(bytes)));
}

// Compression φ = avg: raw K/V of the cmp branch → p.k_cmp / p.v_cmp.
void launch_compress_avg_forward(const NsaParams& p, cudaStream_t stream);
// d_k_cmp / d_v_cmp → raw gradients p.d_k[0] / p.d_v[0] (accumulate when `accumulate`).
void launch_compress_avg_backward(const NsaParams& p, bool accumulate, cudaStream_t stream);

// Forward (nsa_launch.cpp has the order): compressed branch (o_cmp, lse_cmp), block selection
// (sel_idx), selected branch, window branch – which writes o too when it runs last (query-major);
// with the block-major selected branch it runs first and that branch's merge writes o.
// `tiles`: kQueryTileRows-row query tiles.
void launch_compressed_forward(const NsaParams& p, const RowTile* tiles, int64_t n_tiles,
                               cudaStream_t stream);
// Where the selection's CTAs keep their Q rows (select_blocks.cu): kAuto picks by the grid's size;
// the other two (tests, the workshop) force global-memory reloads, or shared memory where it fits.
// The choice changes no result bit.
enum class SelectQ { kAuto, kGlobal, kShared };
void launch_select_blocks(const NsaParams& p, const RowTile* tiles, int64_t n_tiles,
                          cudaStream_t stream, SelectQ q = SelectQ::kAuto);
void launch_selected_forward(const NsaParams& p, cudaStream_t stream);
void launch_window_forward(const NsaParams& p, const RowTile* tiles, int64_t n_tiles,
                           cudaStream_t stream);

// delta_c = g_c · (dO·o_c) and d_gate_c = dO·o_c for every (row, head, branch).
void launch_nsa_backward_preprocess(const NsaParams& p, cudaStream_t stream);
// dq: the compressed and window branches in one kernel write d_q, the selected branch adds to it
// (query-major: launch_selected_dq; block-major: later, in SelBlockMajor::backward).
void launch_compressed_and_window_dq(const NsaParams& p, const RowTile* tiles, int64_t n_tiles,
                                     cudaStream_t stream);
void launch_selected_dq(const NsaParams& p, cudaStream_t stream);
// One dense branch alone (the compressed writes d_q, the window adds): the kernel workshop's
// comparison with the fused kernel.
void launch_compressed_dq(const NsaParams& p, const RowTile* tiles, int64_t n_tiles,
                          cudaStream_t stream);
void launch_window_dq(const NsaParams& p, const RowTile* tiles, int64_t n_tiles,
                      cudaStream_t stream);

}  // namespace nsa::cuda
