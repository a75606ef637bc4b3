// The per-phase breakdown of `nsa bench train` (docs/perf.md, "Training step"): where one step's
// time goes – attention forward and backward, GEMMs, element-wise kernels, LM head + loss,
// optimizer, communication, other – as a table with one column per sequence length and as
// fields of the benchmark's JSON lines. Host-only (tested on the CPU); the times come from CUDA
// events (model/cuda/phase_timer.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "nsa/step_phases.h"

namespace nsa::app {

// One sequence length's breakdown: the mean per step of each phase over the breakdown steps, and
// the mean wall-clock time of the same steps (host to host, synchronised).
struct PhaseColumn {
  int64_t seq_len = 0, batch = 0;
  StepPhaseTimes ms;
  double step_ms = 0;
};

// Rows: every phase, then the sum of the phases and the step's wall time; each cell "ms (share of
// the step)". The sum's share says how much of the step the events account for.
std::string phase_table(const std::vector<PhaseColumn>& columns);
// `,"phases_ms":{"attention_forward":…,…},"phases_sum_ms":…,"phases_step_ms":…` – to append to a
// JSON object.
std::string phase_json_fields(const PhaseColumn& column);

}  // namespace nsa::app
