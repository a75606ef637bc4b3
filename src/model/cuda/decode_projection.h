// The decode step's attention inputs straight from the residual rows, for a few sequences: the
// RMSNorm, the fused input projection [q | k | v | gate logits] and decode_inputs' rotation,
// conversion and gates in one kernel – the bits of launch_gemv (normalised rows) followed by
// launch_decode_inputs, one kernel and one round trip fewer on the step's critical path.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "model/cuda/gemv.h"
#include "model/cuda/model_ops.h"

namespace nsa::cuda {

// Whether the kernel takes the shape: x normalised fp32 rows that launch_gemv takes (gemv_fits,
// B ≤ kGemvMaxRows) with W_in [in.width, D], and the layout's rotated pairs and gate triples
// aligned (dk even, every k offset even, the gate offset a multiple of 3) so that a CTA's columns
// hold whole ones. Otherwise: launch_gemv (or the norm and a GEMM), then launch_decode_inputs.
bool decode_projection_fits(const GemvInput& x, const __nv_bfloat16* w_in, const DecodeInputs& in,
                            int64_t B, int64_t D);

// in's q, k, v and gates for the B rows of x [B, D] (normalised with x.norm_w) at positions[b]:
// exactly what launch_decode_inputs makes of proj = RMSNorm(x)·W_inᵀ.
void launch_decode_projection(const GemvInput& x, const __nv_bfloat16* w_in, const DecodeInputs& in,
                              const int32_t* positions, const float* gate_bias, double rope_base,
                              int64_t B, int64_t D, cudaStream_t stream);

}  // namespace nsa::cuda
