// Launchers of the NSA CUDA kernels (raw pointers in NsaParams + a stream; grid math and launch
// checks inside). The validated entry point is NsaCudaLayer (nsa_cuda_layer.h).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "nsa_params.h"

namespace nsa::cuda {

// Opt-in shared memory per block on Hopper (227 KiB).
constexpr size_t kMaxSmemBytes = 227 * 1024;

// Compression φ = avg: raw K/V of the cmp branch → p.k_cmp / p.v_cmp.
void launch_compress_avg_forward(const NsaParams& p, cudaStream_t stream);
// d_k_cmp / d_v_cmp → raw gradients p.d_k[0] / p.d_v[0] (accumulate when `accumulate`).
void launch_compress_avg_backward(const NsaParams& p, bool accumulate, cudaStream_t stream);

size_t nsa_forward_smem_bytes(const NsaParams& p);
void launch_nsa_forward(const NsaParams& p, cudaStream_t stream);

// delta_c = g_c · (dO·o_c) and d_gate_c = dO·o_c for every (row, head, branch).
void launch_nsa_backward_preprocess(const NsaParams& p, cudaStream_t stream);
// dq of all three branches, one CTA per (row, group).
void launch_nsa_backward_dq(const NsaParams& p, cudaStream_t stream);

}  // namespace nsa::cuda
