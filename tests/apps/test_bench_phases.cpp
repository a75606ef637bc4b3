// The per-phase breakdown of `nsa bench train` (apps/bench_phases.h): every phase in the table and
// in the JSON fields, the shares of the step, the sum row; the JSON parses and its numbers are the
// ones given.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "bench_phases.h"

namespace nsa::app {
namespace {

PhaseColumn column(int64_t S, int64_t B, double scale) {
  PhaseColumn c;
  c.seq_len = S, c.batch = B;
  for (int p = 0; p < kNumStepPhases; ++p) c.ms.ms[p] = scale * (p + 1);  // 1..9: sum 45
  c.step_ms = scale * 50.0;
  return c;
}

TEST(BenchPhases, TableHasEveryPhaseTheSumAndTheStep) {
  const std::string t = phase_table({column(2048, 32, 1.0), column(65536, 1, 10.0)});
  for (const char* name : kStepPhaseNames) {
    EXPECT_NE(t.find(name), std::string::npos) << name << " missing in\n" << t;
  }
  EXPECT_NE(t.find("S=2048 B=32"), std::string::npos) << t;
  EXPECT_NE(t.find("S=65536 B=1"), std::string::npos) << t;
  // attention forward: 1 ms of a 50 ms step; the sum 45 ms = 90 %; the step 500 ms at 64k.
  EXPECT_NE(t.find("1.00 (  2.0%)"), std::string::npos) << t;
  EXPECT_NE(t.find("45.00 ( 90.0%)"), std::string::npos) << t;
  EXPECT_NE(t.find("450.00 ( 90.0%)"), std::string::npos) << t;
  EXPECT_NE(t.find("500.00"), std::string::npos) << t;
  // One header, nine phases, the sum and the step.
  EXPECT_EQ(std::count(t.begin(), t.end(), '\n'), 1 + kNumStepPhases + 2) << t;
}

TEST(BenchPhases, JsonFieldsNameEveryPhase) {
  const PhaseColumn c = column(8192, 8, 2.0);
  const nlohmann::json j = nlohmann::json::parse("{\"S\":8192" + phase_json_fields(c) + "}");
  ASSERT_TRUE(j.contains("phases_ms"));
  ASSERT_EQ(j["phases_ms"].size(), static_cast<size_t>(kNumStepPhases));
  for (int p = 0; p < kNumStepPhases; ++p) {
    EXPECT_DOUBLE_EQ(j["phases_ms"][kStepPhaseKeys[p]].get<double>(), 2.0 * (p + 1))
        << kStepPhaseKeys[p];
  }
  EXPECT_DOUBLE_EQ(j["phases_sum_ms"].get<double>(), 90.0);
  EXPECT_DOUBLE_EQ(j["phases_step_ms"].get<double>(), 100.0);
}

TEST(BenchPhases, TimesAddUpByPhase) {
  StepPhaseTimes t;
  t[StepPhase::kAttentionBackward] += 3.0;
  t[StepPhase::kOther] += 0.5;
  t[StepPhase::kAttentionBackward] += 1.0;
  EXPECT_DOUBLE_EQ(t[StepPhase::kAttentionBackward], 4.0);
  EXPECT_DOUBLE_EQ(t.total(), 4.5);
  EXPECT_STREQ(kStepPhaseNames[static_cast<int>(StepPhase::kCommunication)], "communication");
  EXPECT_STREQ(kStepPhaseKeys[static_cast<int>(StepPhase::kLmHeadLoss)], "lm_head_loss");
}

}  // namespace
}  // namespace nsa::app
