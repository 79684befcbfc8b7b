// The precision tier controller on simulated load traces: where it switches, that it does
// not flap (hysteresis, dwell, a bound on switches per minute), fixed policies, and
// rollbacks that force the high tier for a cool-down.
#include "engine/adaptive/tier_controller.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace metro::engine::adaptive {
namespace {

// A signal whose pressure is `p` through the queue (TTFT objective 1 s).
LoadSignal at(double t, double p, int waiting = 4) {
  LoadSignal s;
  s.now_s = t;
  s.waiting = waiting;
  s.running = 8;
  s.queue_ttft_s = p;
  s.ttft_objective_s = 1.0;
  s.tpot_s = 0.0;
  s.tpot_objective_s = 0.2;
  s.kv_used = 0.0;
  return s;
}

TEST(TierController, PressureIsTheWorstOfQueueTpotAndKv) {
  TierControllerConfig c;
  LoadSignal s = at(0, 0.5);
  EXPECT_DOUBLE_EQ(TierController::pressure(s, c), 0.5);
  s.tpot_s = 0.3;  // 1.5 x the objective
  EXPECT_DOUBLE_EQ(TierController::pressure(s, c), 1.5);
  s.kv_used = 0.99;  // 1.1 x kv_high
  EXPECT_NEAR(TierController::pressure(s, c), 1.5, 1e-12);
  s.tpot_s = 0.0;
  EXPECT_NEAR(TierController::pressure(s, c), 0.99 / 0.9, 1e-12);
  // Nothing waiting: the queue's prediction does not count.
  s = at(0, 5.0, 0);
  EXPECT_DOUBLE_EQ(TierController::pressure(s, c), 0.0);
}

TEST(TierController, StrategyTableByLoad) {
  TierController ctl;
  TierDecision d = ctl.decide(at(0.0, 0.0, 0));
  EXPECT_EQ(d.mode, LoadMode::kLowLatency);
  EXPECT_EQ(d.tier, Tier::kHigh);
  EXPECT_TRUE(d.speculate);
  d = ctl.decide(at(1.0, 0.5));
  EXPECT_EQ(d.mode, LoadMode::kNormal);
  EXPECT_EQ(d.tier, Tier::kHigh);
  EXPECT_TRUE(d.speculate);
  d = ctl.decide(at(2.0, 1.2));
  EXPECT_EQ(d.mode, LoadMode::kHighLoad);
  EXPECT_EQ(d.tier, Tier::kLow);
  EXPECT_FALSE(d.speculate);
  EXPECT_EQ(ctl.stats().switches, 1u);
}

TEST(TierController, BatchBudgetAndAdmissionByMode) {
  TierControllerConfig c;
  c.step_scale = {0.5, 1.0, 1.5};
  c.high_load_ttft_margin = 1.2;
  TierController ctl(c);
  TierDecision d = ctl.decide(at(0.0, 0.0, 0));
  ASSERT_EQ(d.mode, LoadMode::kLowLatency);
  EXPECT_DOUBLE_EQ(d.step_scale, 0.5);
  EXPECT_TRUE(std::isinf(d.admission_ttft_margin_cap));
  d = ctl.decide(at(1.0, 0.5));
  ASSERT_EQ(d.mode, LoadMode::kNormal);
  EXPECT_DOUBLE_EQ(d.step_scale, 1.0);
  EXPECT_TRUE(std::isinf(d.admission_ttft_margin_cap));
  d = ctl.decide(at(2.0, 1.2));
  ASSERT_EQ(d.mode, LoadMode::kHighLoad);
  EXPECT_DOUBLE_EQ(d.step_scale, 1.5);
  EXPECT_DOUBLE_EQ(d.admission_ttft_margin_cap, 1.2);
  EXPECT_DOUBLE_EQ(ctl.stats().step_scale, 1.5);
  // Held through the hysteresis band with the rest of the row, released with it.
  d = ctl.decide(at(4.5, 0.7));
  ASSERT_EQ(d.mode, LoadMode::kHighLoad);
  EXPECT_DOUBLE_EQ(d.admission_ttft_margin_cap, 1.2);
  d = ctl.decide(at(5.0, 0.5));
  ASSERT_EQ(d.mode, LoadMode::kNormal);
  EXPECT_DOUBLE_EQ(d.step_scale, 1.0);
  EXPECT_TRUE(std::isinf(d.admission_ttft_margin_cap));
  // 0 leaves admission alone at high load.
  c.high_load_ttft_margin = 0.0;
  TierController uncapped(c);
  EXPECT_TRUE(std::isinf(uncapped.decide(at(0.0, 3.0)).admission_ttft_margin_cap));
  // The defaults: the scheduler's own step length in every mode.
  TierController defaults;
  EXPECT_DOUBLE_EQ(defaults.decide(at(0.0, 3.0)).step_scale, 1.0);
}

TEST(TierController, CapacityRefusalsHoldHighLoadWhileTheQueueLooksShort) {
  TierControllerConfig c;
  c.overload_hold_s = 10.0;
  TierController ctl(c);
  LoadSignal s = at(0.0, 0.1);  // admission control keeps the queue short
  EXPECT_EQ(ctl.decide(s).tier, Tier::kHigh);
  s.now_s = 1.0;
  s.since_overload_s = 0.0;  // but it is refusing work
  EXPECT_EQ(ctl.decide(s).tier, Tier::kLow);
  s.now_s = 9.0;
  s.since_overload_s = 8.0;
  EXPECT_EQ(ctl.decide(s).tier, Tier::kLow);
  s.now_s = 12.0;
  s.since_overload_s = 11.0;  // no refusal for longer than the hold
  EXPECT_EQ(ctl.decide(s).tier, Tier::kHigh);
}

TEST(TierController, HysteresisAndDwellKeepHighLoadUntilWellBelowItsThreshold) {
  TierControllerConfig c;
  c.min_dwell_s = 2.0;
  TierController ctl(c);
  ASSERT_EQ(ctl.decide(at(0.0, 1.0)).tier, Tier::kLow);  // entered at the threshold
  // Between the two thresholds: stays low.
  EXPECT_EQ(ctl.decide(at(5.0, 0.9)).tier, Tier::kLow);
  EXPECT_EQ(ctl.decide(at(6.0, 0.61)).tier, Tier::kLow);
  // At the lower threshold: back to high.
  EXPECT_EQ(ctl.decide(at(7.0, 0.6)).tier, Tier::kHigh);
  // Re-entered, then a dip within the dwell does not leave.
  EXPECT_EQ(ctl.decide(at(8.0, 1.5)).tier, Tier::kLow);
  EXPECT_EQ(ctl.decide(at(9.0, 0.1)).tier, Tier::kLow);
  EXPECT_EQ(ctl.decide(at(10.5, 0.1)).tier, Tier::kHigh);
  EXPECT_EQ(ctl.stats().switches, 4u);
}

TEST(TierController, SwitchesPerMinuteAreBoundedOnAnOscillatingTrace) {
  TierControllerConfig c;
  c.max_switches_per_minute = 4;
  c.min_dwell_s = 0.0;
  TierController ctl(c);
  // Load that swings across both thresholds every 100 ms for two minutes.
  std::vector<double> switch_times;
  Tier last = Tier::kHigh;
  for (int i = 0; i < 1200; ++i) {
    const double t = 0.1 * i;
    const TierDecision d = ctl.decide(at(t, i % 2 == 0 ? 2.0 : 0.1));
    if (d.tier != last) switch_times.push_back(t);
    last = d.tier;
  }
  ASSERT_FALSE(switch_times.empty());
  // Never more than 4 in any 60 s window.
  for (size_t i = 0; i < switch_times.size(); ++i) {
    size_t n = 0;
    for (size_t j = i; j < switch_times.size() && switch_times[j] < switch_times[i] + 60.0; ++j) ++n;
    EXPECT_LE(n, 4u) << "window from " << switch_times[i];
  }
  EXPECT_EQ(ctl.stats().switches, switch_times.size());
  EXPECT_GT(ctl.stats().switches_deferred, 0u);
}

TEST(TierController, FixedPoliciesIgnoreTheLoad) {
  TierControllerConfig c;
  c.policy = TierPolicy::kHigh;
  TierController high(c);
  EXPECT_EQ(high.decide(at(0, 5.0)).tier, Tier::kHigh);
  c.policy = TierPolicy::kLow;
  TierController low(c);
  EXPECT_EQ(low.decide(at(0, 0.0, 0)).tier, Tier::kLow);
  EXPECT_EQ(low.stats().switches, 0u);
  // The mode (and with it speculation, the batch budget and admission) still follows the load.
  const TierDecision d = high.decide(at(1, 5.0));
  EXPECT_FALSE(d.speculate);
  EXPECT_EQ(d.tier, Tier::kHigh);
  EXPECT_DOUBLE_EQ(d.admission_ttft_margin_cap, c.high_load_ttft_margin);
}

TEST(TierController, RollbackForcesHighForTheCooldownThenLoadDecidesAgain) {
  TierControllerConfig c;
  c.rollback_cooldown_s = 30.0;
  c.max_switches_per_minute = 1;  // a rollback is not held back by the budget
  TierController ctl(c);
  ASSERT_EQ(ctl.decide(at(0.0, 2.0)).tier, Tier::kLow);
  ctl.rollback("shadow_kl", 1.0);
  EXPECT_EQ(ctl.decide(at(1.0, 2.0)).tier, Tier::kHigh);
  EXPECT_TRUE(ctl.stats().cooling_down);
  EXPECT_EQ(ctl.decide(at(30.9, 2.0)).tier, Tier::kHigh);
  EXPECT_EQ(ctl.decide(at(61.5, 2.0)).tier, Tier::kLow);  // cool-down over, and budget back
  EXPECT_EQ(ctl.stats().rollbacks.at("shadow_kl"), 1u);
  // Even a fixed low policy yields to a rollback.
  c.policy = TierPolicy::kLow;
  TierController low(c);
  low.rollback("drift", 0.0);
  EXPECT_EQ(low.decide(at(1.0, 0.0)).tier, Tier::kHigh);
  EXPECT_EQ(low.decide(at(31.0, 0.0)).tier, Tier::kLow);
}

TEST(TierController, Names) {
  Tier t;
  EXPECT_TRUE(parse_tier("low", &t));
  EXPECT_EQ(t, Tier::kLow);
  EXPECT_FALSE(parse_tier("medium", &t));
  TierPolicy p;
  EXPECT_TRUE(parse_tier_policy("auto", &p));
  EXPECT_EQ(p, TierPolicy::kAuto);
  EXPECT_FALSE(parse_tier_policy("", &p));
  EXPECT_STREQ(load_mode_name(LoadMode::kHighLoad), "high_load");
  LoadMode m = LoadMode::kNormal;
  EXPECT_TRUE(parse_load_mode("low_latency", &m));
  EXPECT_EQ(m, LoadMode::kLowLatency);
  EXPECT_FALSE(parse_load_mode("peak", &m));
}

}  // namespace
}  // namespace metro::engine::adaptive
