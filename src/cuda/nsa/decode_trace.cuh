// Phase timestamps of the decode kernels, for finding where a step's time goes (`nsa bench decode
// --trace`): when DecodeParams::trace is set, thread 0 of every CTA writes %globaltimer (ns) at
// fixed points of its kernel into trace[kernel][cta][phase]; points a CTA does not reach stay 0.
// The kernels come in two instances (kTrace): the step launches the one without trace points
// unless the trace is on, so that their code is not fetched at batch 1 (docs/perf.md). The phase
// names are NsaDecodeCuda::trace_phase's. The marks before a kernel's wait are writes before the
// wait, which common/dependent_launch.cuh otherwise rules out: each kernel writes only its own
// region of the trace, which the one kernel that may still run (the one before) never touches.
#pragma once

#include <cstdint>

#include "decode_params.cuh"

namespace nsa::cuda::decode {

template <bool kTrace>
__device__ __forceinline__ void trace_mark(const DecodeParams& p, int kernel, int phase) {
  if constexpr (!kTrace) return;
  if (p.trace == nullptr || threadIdx.x != 0) return;
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  const int64_t cta = blockIdx.x + static_cast<int64_t>(gridDim.x) * blockIdx.y;
  p.trace[(static_cast<int64_t>(kernel) * p.trace_ctas + cta) * kTracePhases + phase] = t;
}

}  // namespace nsa::cuda::decode
