#include "engine/adaptive/tier_controller.h"

#include <algorithm>

namespace metro::engine::adaptive {

const char* tier_name(Tier t) { return t == Tier::kLow ? "low" : "high"; }

bool parse_tier(std::string_view s, Tier* out) {
  if (s == "high") {
    *out = Tier::kHigh;
  } else if (s == "low") {
    *out = Tier::kLow;
  } else {
    return false;
  }
  return true;
}

const char* tier_policy_name(TierPolicy p) {
  switch (p) {
    case TierPolicy::kHigh: return "high";
    case TierPolicy::kLow: return "low";
    default: return "auto";
  }
}

bool parse_tier_policy(std::string_view s, TierPolicy* out) {
  if (s == "auto") {
    *out = TierPolicy::kAuto;
  } else if (s == "high") {
    *out = TierPolicy::kHigh;
  } else if (s == "low") {
    *out = TierPolicy::kLow;
  } else {
    return false;
  }
  return true;
}

const char* load_mode_name(LoadMode m) {
  switch (m) {
    case LoadMode::kLowLatency: return "low_latency";
    case LoadMode::kHighLoad: return "high_load";
    default: return "normal";
  }
}

bool parse_load_mode(std::string_view s, LoadMode* out) {
  for (int m = 0; m < kNumLoadModes; ++m) {
    if (s == load_mode_name(static_cast<LoadMode>(m))) {
      *out = static_cast<LoadMode>(m);
      return true;
    }
  }
  return false;
}

TierController::TierController(TierControllerConfig config) : cfg_(config) {
  stats_.tier = cfg_.policy == TierPolicy::kLow ? Tier::kLow : Tier::kHigh;
}

double TierController::pressure(const LoadSignal& s, const TierControllerConfig& c) {
  double p = 0.0;
  if (s.waiting > 0 && s.ttft_objective_s > 0.0) p = std::max(p, s.queue_ttft_s / s.ttft_objective_s);
  if (s.running > 0 && s.tpot_objective_s > 0.0) p = std::max(p, s.tpot_s / s.tpot_objective_s);
  if (c.kv_high > 0.0) p = std::max(p, s.kv_used / c.kv_high);
  if (s.since_overload_s < c.overload_hold_s) p = std::max(p, 1.0);
  return p;
}

bool TierController::switch_allowed(double now_s) {
  while (!switch_times_.empty() && switch_times_.front() <= now_s - 60.0) switch_times_.pop_front();
  return static_cast<int>(switch_times_.size()) < cfg_.max_switches_per_minute;
}

TierDecision TierController::decide(const LoadSignal& s) {
  const double p = pressure(s, cfg_);
  LoadMode mode = stats_.mode;
  if (p >= cfg_.high_load_pressure) {
    mode = LoadMode::kHighLoad;
  } else if (mode == LoadMode::kHighLoad && (p > cfg_.normal_pressure || s.now_s - mode_since_s_ < cfg_.min_dwell_s)) {
    mode = LoadMode::kHighLoad;  // hysteresis and dwell: high load ends only well below its threshold
  } else if (s.waiting == 0 && p < cfg_.low_latency_pressure) {
    mode = LoadMode::kLowLatency;
  } else {
    mode = LoadMode::kNormal;
  }
  if (mode != stats_.mode) mode_since_s_ = s.now_s;
  stats_.mode = mode;
  stats_.pressure = p;
  stats_.cooling_down = s.now_s < cooldown_until_s_;

  Tier want = Tier::kHigh;
  switch (cfg_.policy) {
    case TierPolicy::kHigh: want = Tier::kHigh; break;
    case TierPolicy::kLow: want = Tier::kLow; break;
    case TierPolicy::kAuto: want = mode == LoadMode::kHighLoad ? Tier::kLow : Tier::kHigh; break;
  }
  if (stats_.cooling_down) want = Tier::kHigh;
  if (want != stats_.tier) {
    // A rollback to the high tier is never held back; any other switch waits for the budget.
    const bool forced = stats_.cooling_down && want == Tier::kHigh;
    if (forced || cfg_.policy != TierPolicy::kAuto || switch_allowed(s.now_s)) {
      stats_.tier = want;
      ++stats_.switches;
      switch_times_.push_back(s.now_s);
    } else {
      ++stats_.switches_deferred;
    }
  }
  TierDecision d;
  d.mode = mode;
  d.tier = stats_.tier;
  d.speculate = mode != LoadMode::kHighLoad;
  // A fixed policy fixes the tier alone: the rest of the row follows the load.
  d.step_scale = cfg_.step_scale[static_cast<size_t>(mode)];
  if (mode == LoadMode::kHighLoad && cfg_.high_load_ttft_margin > 0.0) {
    d.admission_ttft_margin_cap = cfg_.high_load_ttft_margin;
  }
  stats_.step_scale = d.step_scale;
  d.pressure = p;
  return d;
}

void TierController::rollback(std::string_view cause, double now_s) {
  ++stats_.rollbacks[std::string(cause)];
  cooldown_until_s_ = std::max(cooldown_until_s_, now_s + cfg_.rollback_cooldown_s);
  stats_.cooling_down = true;
}

}  // namespace metro::engine::adaptive
