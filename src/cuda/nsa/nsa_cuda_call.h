// NSA attention on caller-owned device memory: one forward or one backward per call, on the
// caller's stream, with no state kept between calls and no allocation or host synchronisation
// inside (the C ABI's CUDA entry points, src/capi/nsa_capi.h, and through them PyTorch).
//
// Unlike NsaCudaLayer, which owns every buffer of one (config, layout) and builds its layout tables
// on the host, a call here takes the caller's tensors as they are (no copies), builds the layout
// tables on the device from a device cu_seqlens (device_layout.h), and carves its scratch from a
// workspace the caller allocated beforehand – of nsa_cuda_workspace_bytes() bytes. The backward
// reads only the forward's outputs: it recomputes the bf16 compressed K/V and φ = mlp's
// activations. Kernels and their order are NsaCudaLayer's (nsa_launch.h).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "nsa/config.h"
#include "nsa_params.h"

namespace nsa::cuda {

// Device pointers of one call, row-major and contiguous. Branch order cmp, sel, win; with
// kv = shared only index 0 of k, v, d_k, d_v is read. φ parameters and their gradients in the
// order pos, w1, b1, w2, b2 (φ = mlp only).
struct NsaCudaIo {
  // Inputs.
  const bf16* q = nullptr;   // [T, H, dk]
  const bf16* k[3] = {};     // [T, G, dk]
  const bf16* v[3] = {};     // [T, G, dv]
  const bf16* gate[3] = {};  // [T, H], gate values
  const float* phi_k[5] = {};
  const float* phi_v[5] = {};
  // Forward outputs, which the backward reads (o excepted). k_cmp / v_cmp have
  // nsa_cuda_compressed_rows(cfg, T, N) rows; the rows past the real count are padding.
  bf16* o = nullptr;           // [T, H, dv]
  bf16* o_branch[3] = {};      // [T, H, dv]
  float* lse[3] = {};          // [T, H]
  float* k_cmp = nullptr;      // [C, G, dk]
  float* v_cmp = nullptr;      // [C, G, dv]
  int32_t* sel_idx = nullptr;  // [T, G, n_sel]
  // Backward: dO in, gradients out (overwritten).
  const bf16* d_o = nullptr;  // [T, H, dv]
  float* d_q = nullptr;
  float* d_k[3] = {};
  float* d_v[3] = {};
  float* d_gate[3] = {};
  float* d_phi_k[5] = {};
  float* d_phi_v[5] = {};
  // grads_bf16: the gradients of q, k, v and the gates in bf16 instead (the d_* above stay null
  // but φ's): the kernels that finish them write these directly (a K/V gradient whose last
  // writer has no bf16 path is converted right after it); their fp32 sums live in the workspace
  // (sized with grads_bf16 = true).
  bool grads_bf16 = false;
  bf16* d_q_bf16 = nullptr;
  bf16* d_k_bf16[3] = {};
  bf16* d_v_bf16[3] = {};
  bf16* d_gate_bf16[3] = {};
  // The block-major selected branch's partial results per pass (0: kSelPartialBudgetBytes). Tests
  // set a few rows' worth to make its rows take several passes; a smaller budget never needs a
  // larger workspace.
  int64_t sel_partial_budget_bytes = 0;
};

// Rows of the compressed K/V buffers for T tokens in N sequences: T / d, a bound on the real count
// that holds for every cu_seqlens (layout_tables.h).
int64_t nsa_cuda_compressed_rows(const NsaConfig& cfg, int64_t T, int64_t N);

// Throws nsa::Error naming what is not supported: no device, a device that is not sm_90, head dims
// the kernels are not built for. (Reads the device's attributes once per device.)
void nsa_cuda_check_supported(const NsaConfig& cfg);

// Workspace bytes of a forward or backward call for T tokens in N sequences (grads_bf16: a
// backward with NsaCudaIo::grads_bf16).
size_t nsa_cuda_workspace_bytes(const NsaConfig& cfg, int64_t T, int64_t N, bool backward,
                                bool grads_bf16 = false);

// cu_seqlens: device, N + 1 entries (null: N sequences of T / N tokens); not checked on the host
// (see layout::sanitized_cu_entry). workspace: 256-byte aligned, at least the bytes above; it is
// in use until the stream reaches the end of the call's work.
void nsa_cuda_forward(const NsaConfig& cfg, int64_t T, int64_t N, const int64_t* cu_seqlens,
                      const NsaCudaIo& io, void* workspace, size_t workspace_bytes,
                      cudaStream_t stream);
void nsa_cuda_backward(const NsaConfig& cfg, int64_t T, int64_t N, const int64_t* cu_seqlens,
                       const NsaCudaIo& io, void* workspace, size_t workspace_bytes,
                       cudaStream_t stream);

}  // namespace nsa::cuda
