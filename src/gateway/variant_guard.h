// What guards the variants of a served name: fault injection for rehearsals, a circuit
// breaker per variant, and step-by-step rollouts that roll back on their own.
//
// Every request's way: the registry's split picks a variant, then route() applies the
// breaker (an open variant's traffic goes to the primary; an open primary is refused at
// once with a Retry-After) and the variant's injected faults. When the request has been
// answered, observe() takes its outcome (failed or not, TTFT, TPOT): it moves the breaker
// and, for a variant under rollout, the sequential tests that compare it with the primary.
//
// The rollout's tests are one-sided CUSUMs (Page's cumulative sums of log-likelihood
// ratios, restarted at 0 whenever they fall below it), one per guarded signal:
//   error rate  a canary request failed (5xx other than a load refusal); p0 is the
//               primary's recent failure rate, p1 = max(2 p0, p0 + 0.05)
//   ttft_p99    a canary request's TTFT above max(1.5 x, + 50 ms) the p99 of the primary's
//   tpot_p99    last 200: p0 = 0.02, p1 = 0.10 (by construction under 1% of the primary's are
//               above it); TPOT alike (+ 10 ms). Only while the primary serves beside
//               the canary (a share under 1): a 100% step has no concurrent reference
//   feedback    a user rated a canary answer bad (POST /v1/feedback): p0 is the primary's
//               recent share of bad ratings (at least 0.02), p1 = max(2 p0, p0 + 0.1)
//   shadow_kl   a shadow-scored canary answer's mean KL from the primary's model above
//               GuardConfig::shadow_kl: p0 = 0.05, p1 = 0.5 (a damaged or wrong canary
//               model; the canary's own answers, scored by both models, off the hot path)
// A test alarms when its sum reaches ln(1 / alpha): under the null hypothesis the mean number
// of canary requests before a false alarm is at least 1 / alpha (Wald's bound on the
// sequential probability ratio test), 1000 at the default alpha of 0.001. An alarm rolls the
// variant back: share 0, logged with its cause and counted. A step is promoted when its time
// has passed, no test alarmed, and it saw at least `min_step_requests` canary requests and
// as many as the error test needs on average to catch a canary failing at p1 (ln(1/alpha) /
// KL(p1 || p0): 83 at p0 = 0.5%, alpha = 0.001), so that a failing canary is caught at the
// share it started at rather than promoted for want of traffic.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "base/metrics.h"
#include "base/status.h"
#include "gateway/model_registry.h"

namespace metro::gateway {

// Faults injected into one variant's requests, off unless configured (--fault).
struct FaultSpec {
  double error = 0.0;          // share of requests answered with `status` at once (0 to 1)
  int status = 500;
  double latency_s = 0.0;      // delay added before the request reaches the engine
  double latency_share = 1.0;  // share of requests delayed (0 to 1)
};

struct BreakerConfig {
  int failures = 5;     // consecutive failed requests that open the breaker (0: no breaker)
  double open_s = 10.0; // how long it stays open before a half-open probe
  // An engine that has had requests but made no progress this long is stuck: its breaker
  // opens (0: never), and stays open while it is.
  double stuck_s = 30.0;
  // How long a model's engine has made no progress; null: Engine::seconds_without_progress.
  std::function<double(const ServedModel&)> stalled_s;
};

struct RolloutPlan {
  std::string name;     // the served name
  std::string variant;  // the variant rolled out
  std::vector<double> shares;  // the steps, each in (0, 1], increasing
  double step_s = 600.0;       // at least this long per step
};

// "NAME:VARIANT=P1,P2,...@DURATION" (percents increasing in (0, 100]); whether the variant
// is served is start_rollout()'s to check.
Expected<RolloutPlan> parse_rollout(const std::string& text);
// "300ms", "30s", "10m", "1h" or plain seconds; nullopt when malformed or negative.
std::optional<double> parse_duration_s(const std::string& text);

struct GuardConfig {
  BreakerConfig breaker;
  // Shadow scoring of a rollout's canary: one of `shadow_every` completed canary requests
  // is scored again, teacher-forced, by the primary's model and the canary's on a thread of
  // their own at the lowest priority; a sample counts against the canary when its mean KL
  // (nats per output token, primary || canary) passes `shadow_kl`. 0: off.
  int shadow_every = 4;
  double shadow_kl = 0.5;
  double alpha = 0.001;        // the rollout tests' false-alarm bound (see above)
  int min_step_requests = 20;  // canary requests a step must see before it is promoted
  int reference_window = 1000; // the primary's recent outcomes the tests compare against
};

enum class BreakerState : uint8_t { kClosed = 0, kHalfOpen = 1, kOpen = 2 };
const char* breaker_state_name(BreakerState s);

// Where one request goes and what it suffers.
struct GuardRoute {
  std::shared_ptr<const ServedModel> model;  // null: refused (every way is open)
  double retry_after_s = 0.0;                // when refused
  bool redirected = false;                   // the breaker sent it to the primary
  int inject_status = 0;                     // non-zero: answer this status at once
  double delay_s = 0.0;                      // injected latency
};

// A rollout's state, for the admin API and the log.
struct RolloutStatus {
  RolloutPlan plan;
  size_t step = 0;              // index into plan.shares
  std::string state;            // "running", "promoted", "rolled_back", "drained", "unloaded"
  std::string cause;            // why it was rolled back
  int step_requests = 0;        // canary requests seen in this step
  int step_requests_needed = 0; // before it may be promoted (see advance())
  double step_elapsed_s = 0.0;
  double cusum_error = 0.0, cusum_ttft = 0.0, cusum_tpot = 0.0, cusum_kl = 0.0, cusum_feedback = 0.0;
  bool shadow = false;          // the canary's answers are shadow-scored
  uint64_t shadow_scored = 0;   // samples scored
  double shadow_kl_mean = 0.0;  // over the scorer's recent window
  double shadow_top1_mean = 0.0;  // share of positions whose top tokens agree, same window
  double threshold = 0.0;       // ln(1 / alpha)
};

class VariantGuard {
 public:
  VariantGuard(ModelRegistry& registry, GuardConfig cfg = {});
  VariantGuard(const VariantGuard&) = delete;
  VariantGuard& operator=(const VariantGuard&) = delete;

  // Faults for `name`'s `variant` ("" the primary). Errors: the model is not served, a
  // share outside [0, 1], a status outside 400-599, a negative latency.
  Status set_fault(const std::string& name, const std::string& variant, const FaultSpec& f);
  // Starts a rollout: the variant's share becomes the first step's. Errors: the variant is
  // not served, a rollout of it already runs, bad steps.
  Status start_rollout(const RolloutPlan& plan);
  // Ends a variant's rollout by hand: share 0 (cause "manual"), or promoted to `share`.
  Status roll_back(const std::string& name, const std::string& variant, const std::string& cause);
  Status promote(const std::string& name, const std::string& variant, double share);
  // Sends a variant no new requests (share 0, its rollout ends as "drained"; not counted as
  // a rollback); those in flight finish on it. Errors: not a served variant.
  Status drain(const std::string& name, const std::string& variant);

  // Makes a variant its name's primary and the primary that variant (ModelRegistry::swap):
  // breakers and faults follow their engines; the tests' reference (the primary's recent
  // outcomes) starts again from the new primary. Errors: not a served variant, its rollout
  // still runs (promote or roll it back first).
  Status swap(const std::string& name, const std::string& variant);

  // A variant no longer served: its rollout ends ("unloaded"), its breaker and faults go.
  void forget(const std::string& name, const std::string& variant);

  // The breaker and faults for a request the split sent to `picked`.
  GuardRoute route(std::shared_ptr<const ServedModel> picked);
  // A request answered by `name`'s `variant`: `failed` for a server failure (not a client
  // error, not a load refusal); ttft_s / tpot_s < 0 when not measured.
  void observe(const std::string& name, const std::string& variant, bool failed, double ttft_s, double tpot_s);

  // Remembers which variant answered `id` (a response id or x-request-id) for `tenant`, so
  // that feedback on it counts there (the last kFeedbackMemory answers).
  void remember(const std::string& id, const std::string& tenant, const std::string& name,
                const std::string& variant);
  // A user's rating of an answer it received. False when `id` is unknown, forgotten, or
  // another tenant's (a tenant learns nothing of other tenants' answers).
  bool feedback(const std::string& id, const std::string& tenant, bool good);
  static constexpr size_t kFeedbackMemory = 65536;

  BreakerState breaker_state(const std::string& name, const std::string& variant);
  std::vector<RolloutStatus> rollouts() const;
  // Gauges and counters: metro_breaker_state, metro_variant_rollbacks_total,
  // metro_variant_promotions_total, metro_fault_injected_total.
  void export_metrics(metrics::Exposition& e) const;

 private:
  struct Breaker {
    BreakerState state = BreakerState::kClosed;
    int consecutive = 0;
    int64_t open_until_ns = 0;
    int64_t probe_ns = 0;  // when the half-open probe went out (0: none out)
  };
  struct Reference {  // the primary's recent outcomes
    std::deque<uint8_t> failed;
    std::deque<double> ttft, tpot;
    std::deque<uint8_t> bad_feedback;  // per rated answer: 1 when rated bad
  };
  struct Answer {
    std::string tenant, name, variant;
  };
  struct Rollout {
    RolloutStatus st;
    int64_t step_start_ns = 0;
    std::shared_ptr<engine::adaptive::ShadowScorer> shadow;  // null: not shadow-scored
    std::shared_ptr<engine::Engine> canary_engine;            // whose output feeds it
    uint64_t shadow_seen = 0;                                 // scorer generation read
  };
  using Key = std::pair<std::string, std::string>;  // (name, variant)

  Breaker& breaker(const Key& k) { return breakers_[k]; }
  void advance(Rollout& r, int64_t now_ns);
  void end_rollout(Rollout& r, const std::string& cause, const char* detail = "");
  void test_canary(Rollout& r, bool failed, double ttft_s, double tpot_s);
  // Reads the shadow samples scored since the last read into the KL test.
  void test_shadow(Rollout& r);
  // Stops feeding a rollout's scorer (the rollout ended).
  static void stop_shadow(Rollout& r);
  // The error test's p0 (the primary's recent failure rate) and p1 for `name`.
  std::pair<double, double> error_hypotheses(const std::string& name);
  // Canary requests the error test needs on average to alarm when the canary fails at p1.
  int requests_to_detect(const std::string& name, double threshold);

  ModelRegistry& registry_;
  GuardConfig cfg_;
  mutable std::mutex mu_;
  std::map<Key, FaultSpec> faults_;
  std::map<Key, Breaker> breakers_;
  std::map<std::string, Reference> reference_;  // by name
  std::map<Key, Rollout> rollouts_;
  std::map<std::tuple<std::string, std::string, std::string>, uint64_t> rollbacks_;  // (name, variant, cause)
  std::map<Key, uint64_t> promotions_;
  std::map<std::tuple<std::string, std::string, std::string>, uint64_t> injected_;  // (name, variant, kind)
  std::map<std::tuple<std::string, std::string, bool>, uint64_t> ratings_;  // (name, variant, good)
  std::unordered_map<std::string, Answer> answers_;
  std::deque<std::string> answer_order_;  // oldest first
};

}  // namespace metro::gateway
