// The adaptive controller of a server with precision tiers (`metro serve --tiers`): once per
// engine step it reads the load (queue, predicted time to first token against the class
// objective, time per output token, KV use), places it in one row of an explicit strategy
// table, and returns what the step runs with:
//
//   mode          when                                     tier  speculation  batch budget  admission
//   low latency   nothing waiting, pressure < low_latency  high  on           x1            as configured
//   normal        otherwise                                high  on           x1            as configured
//   high load     pressure >= high_load (until <= normal)  low   off          x1            margin <= 1
//
// The batch budget is a factor on the scheduler's step length (its time target, and its
// token budget up to max_batch_tokens; sched::Scheduler::set_step_scale), configurable per
// mode (step_scale). Admission at high load refuses a request predicted to miss its class's
// TTFT objective (a margin of at most high_load_ttft_margin), where in the other modes it
// serves one predicted up to `--ttft-margin` times late: at a peak, a late answer takes the
// place of one that would have been on time. A fixed policy (high or low) fixes the tier
// alone; speculation, the batch budget and admission still follow the load.
//
// pressure = max(predicted TTFT / TTFT objective, TPOT / TPOT objective, KV use / kv_high,
//                1 while admission control refused work for lack of capacity in the last
//                overload_hold_s).
// A request pinned to a tier (by class or by its own field) runs there whatever the mode.
//
// Guard rails: hysteresis (high load is entered at high_load and left only at normal), a
// minimum dwell in high load, a bound on tier switches per minute (a switch the budget does
// not allow waits), and rollbacks: the quality monitor may force the high tier for a
// cool-down, each rollback counted by its cause. Pure logic on the caller's clock, so tests
// drive it with simulated load traces.
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <limits>
#include <map>
#include <string>
#include <string_view>

namespace metro::engine::adaptive {

enum class Tier : uint8_t { kHigh = 0, kLow = 1 };
inline constexpr int kNumTiers = 2;
const char* tier_name(Tier t);                   // "high" | "low"
bool parse_tier(std::string_view s, Tier* out);  // false for anything else

enum class TierPolicy : uint8_t { kAuto, kHigh, kLow };
const char* tier_policy_name(TierPolicy p);
bool parse_tier_policy(std::string_view s, TierPolicy* out);  // auto | high | low

enum class LoadMode : uint8_t { kLowLatency = 0, kNormal = 1, kHighLoad = 2 };
inline constexpr int kNumLoadModes = 3;
const char* load_mode_name(LoadMode m);  // "low_latency" | "normal" | "high_load"
bool parse_load_mode(std::string_view s, LoadMode* out);  // false for anything else

struct LoadSignal {
  double now_s = 0.0;             // the caller's clock
  int waiting = 0;                // sequences waiting for their first step
  int running = 0;
  double queue_ttft_s = 0.0;      // predicted time until the waiting prompts are computed
  double ttft_objective_s = 2.0;  // of the most demanding class with work waiting
  double tpot_s = 0.0;            // recent seconds per output token of running sequences
  double tpot_objective_s = 0.2;
  double kv_used = 0.0;           // fraction of KV blocks in use
  // Seconds since admission control last refused a request for lack of capacity (a server
  // that refuses early keeps its queue short, so the queue alone would not show the load).
  double since_overload_s = 1e300;
};

struct TierControllerConfig {
  TierPolicy policy = TierPolicy::kAuto;
  double high_load_pressure = 1.0;    // high load is entered at or above this pressure
  double normal_pressure = 0.6;       // and left at or below this one
  double low_latency_pressure = 0.2;  // below it, with nothing waiting: low latency
  double kv_high = 0.9;               // KV use that counts as pressure 1
  // A capacity refusal this recent counts as pressure 1 (high load holds while refusals
  // keep coming, and for this long after the last).
  double overload_hold_s = 10.0;
  double min_dwell_s = 2.0;           // high load holds at least this long once entered
  int max_switches_per_minute = 6;    // tier switches in any 60 s window
  double rollback_cooldown_s = 60.0;  // the high tier is forced this long after a rollback
  // Realtime requests run in the high tier whatever the load (the engine applies it). Off,
  // they follow the controller: a step at peak is then one pass of the low tier instead of
  // a pass of each.
  bool pin_realtime = true;
  // The batch budget of each mode (indexed by LoadMode): the factor the scheduler's step
  // length is scaled by. Each > 0.
  std::array<double, kNumLoadModes> step_scale{1.0, 1.0, 1.0};
  // Admission's TTFT margin at high load is capped at this (0: no cap).
  double high_load_ttft_margin = 1.0;
};

struct TierDecision {
  LoadMode mode = LoadMode::kNormal;
  Tier tier = Tier::kHigh;  // for requests not pinned to a tier
  bool speculate = true;    // whether drafts are proposed this step
  double step_scale = 1.0;  // the batch budget: the scheduler's step length is scaled by it
  // Cap on admission control's TTFT margin for the requests that come next (+infinity: none).
  double admission_ttft_margin_cap = std::numeric_limits<double>::infinity();
  double pressure = 0.0;
};

struct TierControllerStats {
  Tier tier = Tier::kHigh;
  LoadMode mode = LoadMode::kNormal;
  double pressure = 0.0;
  double step_scale = 1.0;
  uint64_t switches = 0;
  uint64_t switches_deferred = 0;  // switches the per-minute budget held back
  std::map<std::string, uint64_t> rollbacks;  // by cause
  bool cooling_down = false;
};

class TierController {
 public:
  explicit TierController(TierControllerConfig config = {});

  static double pressure(const LoadSignal& s, const TierControllerConfig& c);
  TierDecision decide(const LoadSignal& s);
  // Forces the high tier until now_s + rollback_cooldown_s (a later rollback extends it).
  void rollback(std::string_view cause, double now_s);
  TierControllerStats stats() const { return stats_; }
  const TierControllerConfig& config() const { return cfg_; }

 private:
  bool switch_allowed(double now_s);

  TierControllerConfig cfg_;
  TierControllerStats stats_;
  double mode_since_s_ = -1e300;
  double cooldown_until_s_ = -1e300;
  std::deque<double> switch_times_;
};

}  // namespace metro::engine::adaptive
