// `nsa bench decode --trace`: the decode kernels' phase timestamps (cuda/nsa/decode_trace.cuh) as a
// table – per kernel and phase, over the CTAs that reached it, the earliest, median and latest
// time in µs from the moment the step's inputs were ready (the parts kernel's first CTA released
// by its wait), each the median over the traced steps (the layers of one replay: the timer moves
// in 0.256 µs steps, so one step alone is coarse) – and as JSON lines. `where` says which steps:
// "attention" (the layers' attention alone, back to back in one graph) or "step" (inside the
// model's decode step, between its other kernels). Built with CUDA only.
#pragma once

#include <cstdint>
#include <ostream>

#include "cuda/nsa/nsa_decode.h"

namespace nsa::app {

void report_decode_trace(const cuda::NsaDecodeCuda::Trace& trace, const char* where,
                         int64_t context, int64_t batch, std::ostream* json);

}  // namespace nsa::app
