// Cycle stamps of the one-CTA kernel bench programs (nsa_decode_tile, nsa_decode_select): each
// call records the lengths of its phases, `phases` values a call, one after the other; here each
// call's total and each phase's values over the calls, and their medians.
#pragma once

#include <algorithm>
#include <vector>

struct PhaseCycles {
  std::vector<long long> call;                // per call, the sum of its phases
  std::vector<std::vector<long long>> phase;  // [phase][call]
};

inline PhaseCycles split_phases(const std::vector<long long>& stamps, int calls, int phases) {
  PhaseCycles c;
  c.call.assign(calls, 0);
  c.phase.assign(phases, std::vector<long long>(calls));
  for (int r = 0; r < calls; ++r) {
    for (int i = 0; i < phases; ++i) {
      const long long x = stamps[static_cast<size_t>(r) * phases + i];
      c.call[r] += x;
      c.phase[i][r] = x;
    }
  }
  return c;
}

inline long long median_of(std::vector<long long> x) {
  std::sort(x.begin(), x.end());
  return x.empty() ? 0 : x[x.size() / 2];
}
