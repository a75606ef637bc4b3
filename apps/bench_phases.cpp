// The per-phase breakdown's table and JSON fields (see bench_phases.h).
#include "bench_phases.h"

#include <cstdio>
#include <sstream>

namespace nsa::app {
namespace {

std::string cell(double ms, double step_ms) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%9.2f (%5.1f%%)", ms, step_ms > 0 ? 100.0 * ms / step_ms : 0.0);
  return buf;
}

}  // namespace

std::string phase_table(const std::vector<PhaseColumn>& columns) {
  std::ostringstream out;
  char buf[96];
  std::snprintf(buf, sizeof(buf), "%-22s", "phase (ms, % of step)");
  out << buf;
  for (const PhaseColumn& c : columns) {
    const std::string head = "S=" + std::to_string(c.seq_len) + " B=" + std::to_string(c.batch);
    std::snprintf(buf, sizeof(buf), " %18s", head.c_str());
    out << buf;
  }
  out << "\n";
  const auto row = [&](const char* name, auto value) {
    std::snprintf(buf, sizeof(buf), "%-22s", name);
    std::string line = buf;
    for (const PhaseColumn& c : columns) line += " " + value(c);
    out << line.substr(0, line.find_last_not_of(' ') + 1) << "\n";
  };
  for (int p = 0; p < kNumStepPhases; ++p) {
    row(kStepPhaseNames[p], [p](const PhaseColumn& c) { return cell(c.ms.ms[p], c.step_ms); });
  }
  row("sum of phases", [](const PhaseColumn& c) { return cell(c.ms.total(), c.step_ms); });
  row("step (wall clock)", [](const PhaseColumn& c) {
    char b[32];
    std::snprintf(b, sizeof(b), "%9.2f%9s", c.step_ms, "");
    return std::string(b);
  });
  return out.str();
}

std::string phase_json_fields(const PhaseColumn& column) {
  std::ostringstream out;
  out.precision(6);
  out << ",\"phases_ms\":{";
  for (int p = 0; p < kNumStepPhases; ++p) {
    out << (p ? "," : "") << "\"" << kStepPhaseKeys[p] << "\":" << column.ms.ms[p];
  }
  out << "},\"phases_sum_ms\":" << column.ms.total() << ",\"phases_step_ms\":" << column.step_ms;
  return out.str();
}

}  // namespace nsa::app
