// The decode trace's table (see decode_trace_report.h).
#include "decode_trace_report.h"

#include <algorithm>
#include <cstdio>
#include <vector>

namespace nsa::app {

void report_decode_trace(const cuda::NsaDecodeCuda::Trace& tr, const char* where, int64_t context,
                         int64_t batch, std::ostream* json) {
  using Dec = cuda::NsaDecodeCuda;
  const auto at = [&](int64_t call, int k, int64_t cta, int phase) {
    return tr.t[tr.index(call, k, cta, phase)];
  };
  // Each call's t0: the earliest release of a parts CTA (phase 2: its wait returned, the inputs
  // are ready); 0 where the call did not run traced.
  std::vector<uint64_t> t0(static_cast<size_t>(tr.calls), 0);
  int64_t traced = 0;
  for (int64_t call = 0; call < tr.calls; ++call) {
    for (int64_t c = 0; c < tr.ctas[0]; ++c) {
      const uint64_t t = at(call, 0, c, 2);
      uint64_t& first = t0[static_cast<size_t>(call)];
      if (t != 0 && (first == 0 || t < first)) first = t;
    }
    traced += t0[static_cast<size_t>(call)] != 0 ? 1 : 0;
  }
  std::printf(
      "\ndecode trace (%s), context %lld, B %lld: µs from the inputs being ready (the first "
      "parts CTA released), over the CTAs that got there; each column the median over %lld "
      "steps (the layers of one replay)\n",
      where, static_cast<long long>(context), static_cast<long long>(batch),
      static_cast<long long>(traced));
  std::printf("  %-7s %-20s %6s %9s %9s %9s\n", "kernel", "phase", "CTAs", "first", "median",
              "last");
  if (traced == 0) {
    std::printf("  (no trace: the kernels did not run with it)\n");
    return;
  }
  const auto median = [](std::vector<double>& v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  for (int k = 0; k < Dec::kTraceKernels; ++k) {
    for (int ph = 0; ph < Dec::kTracePhases; ++ph) {
      const char* name = Dec::trace_phase(k, ph);
      if (name == nullptr) continue;
      // Per step: the CTAs' first, median and last time; then each one's median over the steps.
      std::vector<double> firsts, medians, lasts, counts;
      for (int64_t call = 0; call < tr.calls; ++call) {
        const uint64_t origin = t0[static_cast<size_t>(call)];
        if (origin == 0) continue;
        std::vector<double> us;
        for (int64_t c = 0; c < tr.ctas[k]; ++c) {
          const uint64_t t = at(call, k, c, ph);
          if (t != 0) us.push_back((static_cast<double>(t) - static_cast<double>(origin)) * 1e-3);
        }
        if (us.empty()) continue;
        std::sort(us.begin(), us.end());
        firsts.push_back(us.front());
        medians.push_back(us[us.size() / 2]);
        lasts.push_back(us.back());
        counts.push_back(static_cast<double>(us.size()));
      }
      if (firsts.empty()) continue;
      const double first = median(firsts), mid = median(medians), last = median(lasts);
      const auto ctas = static_cast<size_t>(median(counts));
      std::printf("  %-7s %-20s %6zu %9.2f %9.2f %9.2f\n", Dec::trace_kernel(k), name, ctas, first,
                  mid, last);
      if (json) {
        *json << "{\"bench\":\"decode_trace\",\"where\":\"" << where << "\",\"context\":" << context
              << ",\"batch\":" << batch << ",\"kernel\":\"" << Dec::trace_kernel(k)
              << "\",\"phase\":\"" << name << "\",\"steps\":" << firsts.size()
              << ",\"ctas\":" << ctas << ",\"first_us\":" << first << ",\"median_us\":" << mid
              << ",\"last_us\":" << last << "}\n";
      }
    }
  }
  std::fflush(stdout);
}

}  // namespace nsa::app
