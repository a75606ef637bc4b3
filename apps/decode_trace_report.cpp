// The decode trace's table (see decode_trace_report.h).
#include "decode_trace_report.h"

#include <algorithm>
#include <cstdio>
#include <vector>

namespace nsa::app {

void report_decode_trace(const cuda::NsaDecodeCuda::Trace& tr, int64_t context, int64_t batch,
                         std::ostream* json) {
  using Dec = cuda::NsaDecodeCuda;
  const auto at = [&](int k, int64_t cta, int phase) {
    return tr.t[static_cast<size_t>((k * tr.stride + cta) * Dec::kTracePhases + phase)];
  };
  // t0: the earliest release of a parts CTA (phase 2: its wait returned, the inputs are ready).
  uint64_t t0 = 0;
  for (int64_t c = 0; c < tr.ctas[0]; ++c) {
    const uint64_t t = at(0, c, 2);
    if (t != 0 && (t0 == 0 || t < t0)) t0 = t;
  }
  std::printf(
      "\ndecode trace, context %lld, B %lld: µs from the inputs being ready (the first parts "
      "CTA released), over the CTAs that got there\n",
      static_cast<long long>(context), static_cast<long long>(batch));
  std::printf("  %-7s %-20s %6s %9s %9s %9s\n", "kernel", "phase", "CTAs", "first", "median",
              "last");
  if (t0 == 0) {
    std::printf("  (no trace: the kernels did not run with it)\n");
    return;
  }
  for (int k = 0; k < Dec::kTraceKernels; ++k) {
    for (int ph = 0; ph < Dec::kTracePhases; ++ph) {
      const char* name = Dec::trace_phase(k, ph);
      if (name == nullptr) continue;
      std::vector<double> us;
      for (int64_t c = 0; c < tr.ctas[k]; ++c) {
        const uint64_t t = at(k, c, ph);
        if (t != 0) us.push_back((static_cast<double>(t) - static_cast<double>(t0)) * 1e-3);
      }
      if (us.empty()) continue;
      std::sort(us.begin(), us.end());
      const double first = us.front(), median = us[us.size() / 2], last = us.back();
      std::printf("  %-7s %-20s %6zu %9.2f %9.2f %9.2f\n", Dec::trace_kernel(k), name, us.size(),
                  first, median, last);
      if (json) {
        *json << "{\"bench\":\"decode_trace\",\"context\":" << context << ",\"batch\":" << batch
              << ",\"kernel\":\"" << Dec::trace_kernel(k) << "\",\"phase\":\"" << name
              << "\",\"ctas\":" << us.size() << ",\"first_us\":" << first
              << ",\"median_us\":" << median << ",\"last_us\":" << last << "}\n";
      }
    }
  }
  std::fflush(stdout);
}

}  // namespace nsa::app
