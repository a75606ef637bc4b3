// The decode trace's table (apps/decode_trace_report.h) over a made-up trace: each step's times
// from its own origin (its first parts CTA released), each column the median over the traced
// steps, a step that did not run traced left out. Host code: runs without a GPU.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "decode_trace_report.h"

namespace nsa::app {
namespace {

using Dec = cuda::NsaDecodeCuda;
constexpr int kParts = 0, kPicks = 2, kReleased = 2, kCombined = 7;

// Four step slots with two parts CTAs, one top-n and one picks CTA; slot 3 was never traced.
Dec::Trace made_up_trace() {
  Dec::Trace tr;
  tr.ctas[0] = 2, tr.ctas[1] = 1, tr.ctas[2] = 1;
  tr.stride = 2, tr.calls = 4;
  tr.t.assign(static_cast<size_t>(tr.calls * Dec::kTraceKernels * tr.stride * Dec::kTracePhases),
              0);
  const auto set = [&](int64_t call, int k, int64_t cta, int phase, uint64_t ns) {
    tr.t[tr.index(call, k, cta, phase)] = ns;
  };
  const uint64_t combined_ns[3] = {10000, 12000, 11000};  // median 11 µs
  for (int64_t call = 0; call < 3; ++call) {
    const uint64_t origin = 1000000 * static_cast<uint64_t>(call + 1);
    set(call, kParts, 0, kReleased, origin + 512);  // the later CTA first: t0 is the minimum
    set(call, kParts, 1, kReleased, origin);
    set(call, kPicks, 0, kCombined, origin + combined_ns[call]);
  }
  return tr;
}

std::vector<nlohmann::json> report_lines(const Dec::Trace& tr) {
  std::ostringstream json;
  report_decode_trace(tr, "step", 65536, 1, &json);
  std::vector<nlohmann::json> lines;
  std::istringstream in(json.str());
  for (std::string line; std::getline(in, line);) lines.push_back(nlohmann::json::parse(line));
  return lines;
}

const nlohmann::json* find(const std::vector<nlohmann::json>& lines, const char* kernel,
                           const char* phase) {
  for (const nlohmann::json& j : lines) {
    if (j["kernel"] == kernel && j["phase"] == phase) return &j;
  }
  return nullptr;
}

TEST(DecodeTraceReport, ColumnsAreMediansOverTheTracedSteps) {
  const std::vector<nlohmann::json> lines = report_lines(made_up_trace());
  ASSERT_EQ(lines.size(), 2u);  // only the phases some CTA reached
  const nlohmann::json* combined = find(lines, "picks", Dec::trace_phase(kPicks, kCombined));
  ASSERT_NE(combined, nullptr);
  EXPECT_EQ((*combined)["where"], "step");
  EXPECT_EQ((*combined)["steps"], 3);
  EXPECT_EQ((*combined)["ctas"], 1);
  EXPECT_DOUBLE_EQ((*combined)["median_us"].get<double>(), 11.0);
  EXPECT_DOUBLE_EQ((*combined)["first_us"].get<double>(), 11.0);
  const nlohmann::json* released = find(lines, "parts", Dec::trace_phase(kParts, kReleased));
  ASSERT_NE(released, nullptr);
  EXPECT_EQ((*released)["ctas"], 2);
  EXPECT_DOUBLE_EQ((*released)["first_us"].get<double>(), 0.0);
  EXPECT_DOUBLE_EQ((*released)["last_us"].get<double>(), 0.512);
}

// A model's trace is its layers' traces appended (ModelDecoderCuda::trace): call c of the second
// lands at call calls₁ + c, and the report reads the joined trace as one.
TEST(DecodeTraceReport, AppendedTracesKeepEachCallsTimes) {
  const Dec::Trace first = made_up_trace();
  Dec::Trace joined;
  joined.append(first);
  joined.append(first);
  ASSERT_EQ(joined.calls, 2 * first.calls);
  ASSERT_EQ(joined.t.size(), 2 * first.t.size());
  for (int64_t call = 0; call < first.calls; ++call) {
    EXPECT_EQ(joined.t[joined.index(first.calls + call, kPicks, 0, kCombined)],
              first.t[first.index(call, kPicks, 0, kCombined)]);
    EXPECT_EQ(joined.t[joined.index(call, kParts, 0, kReleased)],
              first.t[first.index(call, kParts, 0, kReleased)]);
  }
  const std::vector<nlohmann::json> lines = report_lines(joined);
  const nlohmann::json* combined = find(lines, "picks", Dec::trace_phase(kPicks, kCombined));
  ASSERT_NE(combined, nullptr);
  EXPECT_EQ((*combined)["steps"], 6);
  EXPECT_DOUBLE_EQ((*combined)["median_us"].get<double>(), 11.0);
  Dec::Trace other = made_up_trace();
  other.stride = 3;
  EXPECT_THROW(joined.append(other), Error);
}

TEST(DecodeTraceReport, NoTracedStepWritesNoLine) {
  Dec::Trace tr = made_up_trace();
  std::fill(tr.t.begin(), tr.t.end(), 0);
  EXPECT_TRUE(report_lines(tr).empty());
}

}  // namespace
}  // namespace nsa::app
