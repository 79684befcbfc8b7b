// The issue-8 benchmark scenarios in the simulator. Simulated time is deterministic, so
// the targets are asserted; the tables are printed for docs/scheduling.md.
#include <gtest/gtest.h>

#include <cstdio>

#include "sched/sim/scenarios.h"

namespace metro::sched::sim {
namespace {

constexpr uint64_t kSeed = 42;

void report(const ScenarioResult& r) {
  std::fputs(r.text.c_str(), stdout);
  std::fflush(stdout);
}

TEST(SlaBenchmark, RealtimeOverBatchFlood) {
  ScenarioResult r = scenario_priority(kSeed);
  report(r);
  EXPECT_TRUE(r.passed);
}

TEST(SlaBenchmark, MixedLengthsAtNinetyPercent) {
  ScenarioResult r = scenario_mixed(kSeed);
  report(r);
  EXPECT_TRUE(r.passed);
}

TEST(SlaBenchmark, MixedLengthsAcrossSeedsAndMixes) {
  ScenarioResult r = scenario_mixed_seeds({kSeed, 1, 7, 2, 3, 11});
  report(r);
  EXPECT_TRUE(r.passed);
}

TEST(SlaBenchmark, MixedLengthsMeasuredEngine) {
  // The engine as its step-cost fit finds it. The floors: the default 2.0x on every bimodal
  // sample, `lower` 2.0x, the default's median gain 1.7x (docs/scheduling.md has the
  // measured ranges).
  ScenarioResult r = scenario_mixed_seeds({kSeed, 1, 7, 2, 3, 11}, CostModel::measured(), 2.0, 1.7, 2.0);
  report(r);
  EXPECT_TRUE(r.passed);
}

TEST(SlaBenchmark, MixedLengthsSlowStepsEngine) {
  // The fit of an engine with dearer steps (fixed cost and decodes). Both floors sit a
  // little under 2x so that a sample at 2.0x does not decide the verdict on its third
  // decimal.
  ScenarioResult r = scenario_mixed_seeds({kSeed, 1, 7, 2, 3, 11}, CostModel::measured_slow_steps(), 1.9, 1.9);
  report(r);
  EXPECT_TRUE(r.passed);
}

TEST(SlaBenchmark, MixedLengthsByRunLength) {
  ScenarioResult r = scenario_mixed_horizon({1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, CostModel::measured());
  report(r);
  EXPECT_TRUE(r.passed);
}

TEST(SlaBenchmark, MixedLengthsWhereTheMeanGoes) {
  ScenarioResult r = scenario_mixed_breakdown({kSeed, 2}, CostModel::measured());
  report(r);
  EXPECT_TRUE(r.passed);
}

TEST(SlaBenchmark, TwiceOverloadWithAdmission) {
  ScenarioResult r = scenario_overload(kSeed);
  report(r);
  EXPECT_TRUE(r.passed);
}

TEST(SlaBenchmark, TwoTenantsFairShare) {
  ScenarioResult r = scenario_tenants(kSeed);
  report(r);
  EXPECT_TRUE(r.passed);
}

}  // namespace
}  // namespace metro::sched::sim
