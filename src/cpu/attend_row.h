// Softmax attention of one query row over a list of key ranges: the kernel all three NSA branches
// share on the CPU.
//
// The compressed branch attends over one range of compressed tokens, the window branch over one
// range of raw tokens, the selected branch over up to n_sel block ranges. Forward returns the
// log-sum-exp so the backward can recompute probabilities instead of storing them (no S × S).
//
// Backward of o = Σ_j p_j v_j, p = softmax(s), s_j = scale · q·k_j, with D = dO·o:
//   dv_j += p_j dO,   ds_j = p_j (dO·v_j − D),   dq += scale Σ_j ds_j k_j,   dk_j += scale ds_j q.
#pragma once

#include <cstdint>

namespace nsa::cpu {

struct KeyRange {
  int64_t begin;  // first key row
  int64_t end;    // one past the last key row
};

// Key/value rows: row r of K starts at k + r * k_stride (same for V). The gradient buffers of
// the backward use the same strides.
template <typename Real>
struct RowKv {
  const Real* k;
  const Real* v;
  int64_t k_stride;
  int64_t v_stride;
};

// q [dk], out [dv], probs [Σ range lengths] receives the softmax probabilities in range order.
// Returns the log-sum-exp of the scaled scores; with no keys, returns -inf and writes out = 0.
template <typename Real>
Real attend_row_forward(const Real* q, const RowKv<Real>& kv, const KeyRange* ranges, int n_ranges,
                        int64_t dk, int64_t dv, Real scale, Real* out, Real* probs);

// Accumulates (+=) into dq [dk] and into the rows of dk_rows / dv_rows (strides as in kv).
template <typename Real>
void attend_row_backward(const Real* q, const RowKv<Real>& kv, const KeyRange* ranges, int n_ranges,
                         int64_t dk, int64_t dv, Real scale, Real lse, const Real* out,
                         const Real* d_out, Real* dq, Real* dk_rows, Real* dv_rows);

}  // namespace nsa::cpu
