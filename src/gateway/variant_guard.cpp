#include "gateway/variant_guard.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>

#include "base/clock.h"
#include "base/log.h"

namespace metro::gateway {

namespace {

constexpr double kNsPerS = 1e9;
// The latency tests: a canary value counts as "above" past max(the primary's p99 x this, p99
// + the slack below). A latency regression worth a rollback is a large one; a canary whose
// latency matches the primary's but whose samples fall in a busier moment than the
// reference's (load moves with the split) must not count against it.
constexpr double kLatencyTolerance = 1.5;
constexpr double kTtftSlackS = 0.05;
constexpr double kTpotSlackS = 0.01;
// The primary's latencies the tests compare with: its most recent ones, close in time to
// the canary's.
constexpr size_t kLatencyWindow = 200;
constexpr double kLatencyP0 = 0.02;
constexpr double kLatencyP1 = 0.10;
// The shadow test: a sample above GuardConfig::shadow_kl.
constexpr double kShadowP0 = 0.05;
constexpr double kShadowP1 = 0.5;
// The primary's latencies needed before the latency tests run.
constexpr size_t kMinReference = 50;
// A half-open probe that never reported (its client left) lets another one go after this.
constexpr int64_t kProbeTimeoutNs = 60'000'000'000;

double uniform01() {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  return static_cast<double>(rng() >> 11) * 0x1.0p-53;
}

// One Bernoulli observation's log-likelihood ratio of p1 against p0.
double llr(bool hit, double p0, double p1) { return hit ? std::log(p1 / p0) : std::log((1.0 - p1) / (1.0 - p0)); }

double p99(const std::deque<double>& v) {
  std::vector<double> s(v.begin(), v.end());
  const size_t k = static_cast<size_t>(std::ceil(0.99 * static_cast<double>(s.size()))) - 1;
  std::nth_element(s.begin(), s.begin() + static_cast<long>(k), s.end());
  return s[k];
}

template <typename T>
void push_bounded(std::deque<T>& d, T v, size_t cap) {
  d.push_back(v);
  while (d.size() > cap) d.pop_front();
}

std::string id_of(const std::string& name, const std::string& variant) {
  return variant.empty() ? name : name + "@" + variant;
}

}  // namespace

std::optional<double> parse_duration_s(const std::string& text) {
  struct Unit {
    const char* suffix;
    double seconds;
  };
  // Longest suffix first: "ms" before "s".
  static constexpr Unit kUnits[] = {{"ms", 1e-3}, {"s", 1.0}, {"m", 60.0}, {"h", 3600.0}};
  std::string number = text;
  double scale = 1.0;
  for (const Unit& u : kUnits) {
    const size_t n = std::strlen(u.suffix);
    if (text.size() > n && text.compare(text.size() - n, n, u.suffix) == 0) {
      number = text.substr(0, text.size() - n);
      scale = u.seconds;
      break;
    }
  }
  char* end = nullptr;
  const double v = std::strtod(number.c_str(), &end);
  if (number.empty() || end != number.c_str() + number.size() || !std::isfinite(v) || v < 0) return std::nullopt;
  return v * scale;
}

Expected<RolloutPlan> parse_rollout(const std::string& a) {
  const size_t colon = a.find(':'), eq = a.find('=', colon == std::string::npos ? 0 : colon), at = a.rfind('@');
  const auto bad = [&](const std::string& why) { return invalid_argument("--rollout '" + a + "': " + why); };
  if (colon == std::string::npos || eq == std::string::npos || at == std::string::npos || at < eq) {
    return bad("write NAME:VARIANT=PERCENT,PERCENT,...@DURATION");
  }
  RolloutPlan p;
  p.name = a.substr(0, colon);
  p.variant = a.substr(colon + 1, eq - colon - 1);
  if (p.name.empty() || p.variant.empty()) return bad("write NAME:VARIANT=PERCENT,PERCENT,...@DURATION");
  const std::string steps = a.substr(eq + 1, at - eq - 1);
  size_t start = 0;
  while (start <= steps.size()) {
    const size_t comma = std::min(steps.find(',', start), steps.size());
    const std::string pct = steps.substr(start, comma - start);
    char* end = nullptr;
    const double v = std::strtod(pct.c_str(), &end);
    if (pct.empty() || end != pct.c_str() + pct.size() || !std::isfinite(v) || v <= 0 || v > 100) {
      return bad("each step is a percent in (0, 100]");
    }
    if (!p.shares.empty() && v / 100.0 <= p.shares.back()) return bad("the steps must increase");
    p.shares.push_back(v / 100.0);
    start = comma + 1;
  }
  const auto d = parse_duration_s(a.substr(at + 1));
  if (!d || *d <= 0) return bad("the step duration is a time such as 30s, 10m or 1h");
  p.step_s = *d;
  return p;
}

const char* breaker_state_name(BreakerState s) {
  switch (s) {
    case BreakerState::kClosed: return "closed";
    case BreakerState::kHalfOpen: return "half_open";
    case BreakerState::kOpen: return "open";
  }
  return "closed";
}

VariantGuard::VariantGuard(ModelRegistry& registry, GuardConfig cfg) : registry_(registry), cfg_(cfg) {}

Status VariantGuard::set_fault(const std::string& name, const std::string& variant, const FaultSpec& f) {
  bool served = false;
  for (const auto& m : registry_.variants(name)) served = served || m->variant == variant;
  if (!served) return invalid_argument("--fault: no model '" + id_of(name, variant) + "' is served");
  if (!(f.error >= 0.0 && f.error <= 1.0) || !(f.latency_share >= 0.0 && f.latency_share <= 1.0)) {
    return invalid_argument("--fault: shares are between 0 and 1");
  }
  if (f.status < 400 || f.status > 599) return invalid_argument("--fault: the status must be from 400 to 599");
  if (!(f.latency_s >= 0.0 && f.latency_s <= 3600.0)) return invalid_argument("--fault: latency from 0 to 1 hour");
  std::lock_guard lock(mu_);
  faults_[{name, variant}] = f;
  return Status();
}

Status VariantGuard::start_rollout(const RolloutPlan& plan) {
  if (plan.variant.empty()) return invalid_argument("--rollout: name a variant (NAME:VARIANT=STEPS)");
  if (plan.shares.empty()) return invalid_argument("--rollout: no steps");
  for (size_t i = 0; i < plan.shares.size(); ++i) {
    const double s = plan.shares[i];
    if (!(s > 0.0 && s <= 1.0) || (i > 0 && s <= plan.shares[i - 1])) {
      return invalid_argument("--rollout: steps are increasing percents in (0, 100]");
    }
  }
  if (!(plan.step_s > 0.0)) return invalid_argument("--rollout: a step lasts more than 0 s");
  {
    std::lock_guard lock(mu_);
    auto it = rollouts_.find({plan.name, plan.variant});
    if (it != rollouts_.end() && it->second.st.state == "running") {
      return invalid_argument("a rollout of '" + id_of(plan.name, plan.variant) + "' runs already");
    }
  }
  METRO_RETURN_IF_ERROR(registry_.set_split(plan.name, plan.variant, plan.shares.front()));
  Rollout r;
  r.st.plan = plan;
  r.st.state = "running";
  r.st.threshold = std::log(1.0 / cfg_.alpha);
  r.step_start_ns = now_ns();
  if (cfg_.shadow_every > 0) {
    std::shared_ptr<const ServedModel> primary, canary;
    for (const auto& m : registry_.variants(plan.name)) {
      if (m->variant.empty()) primary = m;
      if (m->variant == plan.variant) canary = m;
    }
    if (primary && canary && primary->tokenizer().n_vocab() == canary->tokenizer().n_vocab()) {
      engine::adaptive::ShadowConfig sc;
      sc.every = cfg_.shadow_every;
      sc.window = 16;
      sc.min_samples = 1;
      sc.layer_drift = false;
      r.shadow = std::make_shared<engine::adaptive::ShadowScorer>(primary->engine->shared_model(),
                                                                   canary->engine->shared_model(), sc);
      r.canary_engine = canary->engine;
      r.st.shadow = true;
      std::weak_ptr<engine::adaptive::ShadowScorer> weak = r.shadow;
      r.canary_engine->set_output_sink([weak](const std::vector<int32_t>& tokens, int n_prompt) {
        auto s = weak.lock();
        if (s && s->wants_next()) s->offer(tokens, n_prompt);
      });
    }
  }
  std::shared_ptr<engine::adaptive::ShadowScorer> previous;  // an ended rollout's, joined outside the lock
  std::lock_guard lock(mu_);
  Rollout& slot = rollouts_[{plan.name, plan.variant}];
  previous = std::move(slot.shadow);
  slot = r;
  METRO_LOG_INFO("rollout of %s: step 1 of %zu, %.0f%% of '%s'", id_of(plan.name, plan.variant).c_str(),
                 plan.shares.size(), plan.shares.front() * 100.0, plan.name.c_str());
  return Status();
}

void VariantGuard::stop_shadow(Rollout& r) {
  if (r.canary_engine) r.canary_engine->set_output_sink(nullptr);
  r.canary_engine.reset();
}

void VariantGuard::end_rollout(Rollout& r, const std::string& cause, const char* detail) {
  const RolloutPlan& p = r.st.plan;
  stop_shadow(r);
  (void)registry_.set_split(p.name, p.variant, 0.0);
  r.st.state = "rolled_back";
  r.st.cause = cause;
  ++rollbacks_[{p.name, p.variant, cause}];
  METRO_LOG_WARN("rollout of %s rolled back at step %zu (%.0f%%): %s%s; its share is now 0",
                 id_of(p.name, p.variant).c_str(), r.st.step + 1, p.shares[r.st.step] * 100.0, cause.c_str(), detail);
}

Status VariantGuard::roll_back(const std::string& name, const std::string& variant, const std::string& cause) {
  std::lock_guard lock(mu_);
  auto it = rollouts_.find({name, variant});
  if (it != rollouts_.end() && it->second.st.state == "running") {
    end_rollout(it->second, cause);
    return Status();
  }
  METRO_RETURN_IF_ERROR(registry_.set_split(name, variant, 0.0));
  ++rollbacks_[{name, variant, cause}];
  METRO_LOG_WARN("%s rolled back: %s; its share is now 0", id_of(name, variant).c_str(), cause.c_str());
  return Status();
}

Status VariantGuard::promote(const std::string& name, const std::string& variant, double share) {
  std::lock_guard lock(mu_);
  METRO_RETURN_IF_ERROR(registry_.set_split(name, variant, share));
  auto it = rollouts_.find({name, variant});
  if (it != rollouts_.end() && it->second.st.state == "running") {
    it->second.st.state = "promoted";
    stop_shadow(it->second);
  }
  ++promotions_[{name, variant}];
  METRO_LOG_INFO("%s promoted by hand to %.0f%%", id_of(name, variant).c_str(), share * 100.0);
  return Status();
}

void VariantGuard::forget(const std::string& name, const std::string& variant) {
  std::shared_ptr<engine::adaptive::ShadowScorer> scorer;  // joined outside the lock
  std::lock_guard lock(mu_);
  faults_.erase({name, variant});
  breakers_.erase({name, variant});
  for (auto& [key, r] : rollouts_) {
    // The scorer holds both models' weights: a rollout of or against an unloaded model lets
    // them go.
    if (key.first != name || (!variant.empty() && key.second != variant)) continue;
    if (r.st.state == "running") r.st.state = "unloaded";
    stop_shadow(r);
    scorer = std::move(r.shadow);
  }
  if (variant.empty()) reference_.erase(name);
}

Status VariantGuard::swap(const std::string& name, const std::string& variant) {
  std::lock_guard lock(mu_);
  auto it = rollouts_.find({name, variant});
  if (it != rollouts_.end() && it->second.st.state == "running") {
    return invalid_argument("the rollout of " + id_of(name, variant) + " is running; promote or roll it back first");
  }
  METRO_RETURN_IF_ERROR(registry_.swap(name, variant));
  const Key p{name, std::string()}, v{name, variant};
  auto exchange = [&](auto& map) {
    auto a = map.extract(p), b = map.extract(v);
    if (a) {
      a.key() = v;
      map.insert(std::move(a));
    }
    if (b) {
      b.key() = p;
      map.insert(std::move(b));
    }
  };
  exchange(faults_);
  exchange(breakers_);
  reference_.erase(name);
  METRO_LOG_INFO("'%s' and its variant '%s' swapped: the variant's engine now serves as '%s', the former primary's "
                 "as '%s'",
                 name.c_str(), variant.c_str(), name.c_str(), id_of(name, variant).c_str());
  return Status();
}

Status VariantGuard::drain(const std::string& name, const std::string& variant) {
  std::lock_guard lock(mu_);
  METRO_RETURN_IF_ERROR(registry_.set_split(name, variant, 0.0));
  auto it = rollouts_.find({name, variant});
  if (it != rollouts_.end() && it->second.st.state == "running") {
    it->second.st.state = "drained";
    stop_shadow(it->second);
  }
  METRO_LOG_INFO("%s drained: no new requests; those in flight finish on it", id_of(name, variant).c_str());
  return Status();
}

GuardRoute VariantGuard::route(std::shared_ptr<const ServedModel> picked) {
  GuardRoute out;
  if (!picked) return out;
  const int64_t now = now_ns();
  std::lock_guard lock(mu_);
  // Whether the breaker lets a request through to m (taking the half-open probe if so).
  auto passes = [&](const ServedModel& m, int64_t* retry_ns) {
    const Key k{m.name, m.variant};
    if (cfg_.breaker.stuck_s > 0) {
      const double stalled = cfg_.breaker.stalled_s ? cfg_.breaker.stalled_s(m) : m.engine->seconds_without_progress();
      if (stalled > cfg_.breaker.stuck_s) {
        Breaker& b = breakers_[k];
        if (b.state != BreakerState::kOpen) {
          METRO_LOG_WARN("circuit breaker of %s open: its engine has made no progress for %.0f s",
                         m.id().c_str(), stalled);
        }
        b.state = BreakerState::kOpen;
        b.open_until_ns = now + static_cast<int64_t>(cfg_.breaker.open_s * kNsPerS);
        b.probe_ns = 0;
      }
    }
    auto it = breakers_.find(k);
    if (it == breakers_.end()) return true;
    Breaker& b = it->second;
    if (b.state == BreakerState::kOpen && now >= b.open_until_ns) b.state = BreakerState::kHalfOpen;
    switch (b.state) {
      case BreakerState::kClosed: return true;
      case BreakerState::kOpen: *retry_ns = b.open_until_ns - now; return false;
      case BreakerState::kHalfOpen:
        if (b.probe_ns == 0 || now - b.probe_ns > kProbeTimeoutNs) {
          b.probe_ns = now;
          return true;
        }
        *retry_ns = std::max<int64_t>(1'000'000'000, b.open_until_ns - now);
        return false;
    }
    return true;
  };
  int64_t retry_ns = 0;
  std::shared_ptr<const ServedModel> chosen = picked;
  if (!passes(*picked, &retry_ns)) {
    chosen = nullptr;
    if (!picked->variant.empty()) {
      // An open variant's traffic goes to the primary, when the primary's breaker lets it.
      for (const auto& m : registry_.variants(picked->name)) {
        if (m->variant.empty() && passes(*m, &retry_ns)) chosen = m;
      }
      out.redirected = chosen != nullptr;
    }
  }
  if (!chosen) {
    out.retry_after_s = std::max(1.0, std::ceil(static_cast<double>(retry_ns) / kNsPerS));
    return out;
  }
  out.model = chosen;
  auto f = faults_.find({chosen->name, chosen->variant});
  if (f != faults_.end()) {
    const FaultSpec& spec = f->second;
    if (spec.error > 0.0 && uniform01() < spec.error) {
      out.inject_status = spec.status;
      ++injected_[{chosen->name, chosen->variant, "error"}];
    } else if (spec.latency_s > 0.0 && uniform01() < spec.latency_share) {
      out.delay_s = spec.latency_s;
      ++injected_[{chosen->name, chosen->variant, "latency"}];
    }
  }
  return out;
}

void VariantGuard::observe(const std::string& name, const std::string& variant, bool failed, double ttft_s,
                           double tpot_s) {
  const int64_t now = now_ns();
  std::lock_guard lock(mu_);
  if (cfg_.breaker.failures > 0) {
    Breaker& b = breaker({name, variant});
    if (failed) {
      ++b.consecutive;
      if (b.state == BreakerState::kHalfOpen || b.consecutive >= cfg_.breaker.failures) {
        if (b.state != BreakerState::kOpen) {
          METRO_LOG_WARN("circuit breaker of %s open after %d failed requests in a row; retried in %.0f s",
                         id_of(name, variant).c_str(), b.consecutive, cfg_.breaker.open_s);
        }
        b.state = BreakerState::kOpen;
        b.open_until_ns = now + static_cast<int64_t>(cfg_.breaker.open_s * kNsPerS);
        b.probe_ns = 0;
      }
    } else {
      b.consecutive = 0;
      if (b.state != BreakerState::kClosed) METRO_LOG_INFO("circuit breaker of %s closed", id_of(name, variant).c_str());
      b.state = BreakerState::kClosed;
      b.probe_ns = 0;
    }
  }
  if (variant.empty()) {
    Reference& ref = reference_[name];
    const size_t cap = static_cast<size_t>(std::max(1, cfg_.reference_window));
    push_bounded<uint8_t>(ref.failed, failed ? 1 : 0, cap);
    if (ttft_s >= 0) push_bounded(ref.ttft, ttft_s, std::min(cap, kLatencyWindow));
    if (tpot_s >= 0) push_bounded(ref.tpot, tpot_s, std::min(cap, kLatencyWindow));
  }
  for (auto& [key, r] : rollouts_) {
    if (r.st.state != "running" || key.first != name) continue;
    if (key.second == variant) {
      test_shadow(r);
      if (r.st.state == "running") test_canary(r, failed, ttft_s, tpot_s);
    }
    advance(r, now);
  }
}

std::pair<double, double> VariantGuard::error_hypotheses(const std::string& name) {
  const Reference& ref = reference_[name];
  // The primary's failure rate, smoothed so that a clean record is not a rate of 0.
  double fails = 0;
  for (uint8_t f : ref.failed) fails += f;
  const double p0 = std::clamp((fails + 0.5) / (static_cast<double>(ref.failed.size()) + 1.0), 0.002, 0.5);
  return {p0, std::min(0.95, std::max(2.0 * p0, p0 + 0.05))};
}

int VariantGuard::requests_to_detect(const std::string& name, double threshold) {
  const auto [p0, p1] = error_hypotheses(name);
  // The mean drift of the error CUSUM under p1: its Kullback-Leibler divergence from p0.
  const double kl = p1 * std::log(p1 / p0) + (1.0 - p1) * std::log((1.0 - p1) / (1.0 - p0));
  return static_cast<int>(std::ceil(threshold / kl));
}

void VariantGuard::test_canary(Rollout& r, bool failed, double ttft_s, double tpot_s) {
  ++r.st.step_requests;
  const Reference& ref = reference_[r.st.plan.name];
  const auto [p0, p1] = error_hypotheses(r.st.plan.name);
  r.st.cusum_error = std::max(0.0, r.st.cusum_error + llr(failed, p0, p1));
  // The latency tests compare the canary with the primary serving beside it, under the same
  // load from outside. At a share of 1 the primary serves nothing: its latencies are from
  // before, when the machine's load may have been another, so the latency tests hold their
  // sums (a latency regression shows at the earlier, shared steps).
  const bool beside = r.st.plan.shares[r.st.step] < 1.0;
  if (beside && !failed && ttft_s >= 0 && ref.ttft.size() >= kMinReference) {
    const double p = p99(ref.ttft);
    const bool above = ttft_s > std::max(p * kLatencyTolerance, p + kTtftSlackS);
    r.st.cusum_ttft = std::max(0.0, r.st.cusum_ttft + llr(above, kLatencyP0, kLatencyP1));
  }
  if (beside && !failed && tpot_s >= 0 && ref.tpot.size() >= kMinReference) {
    const double p = p99(ref.tpot);
    const bool above = tpot_s > std::max(p * kLatencyTolerance, p + kTpotSlackS);
    r.st.cusum_tpot = std::max(0.0, r.st.cusum_tpot + llr(above, kLatencyP0, kLatencyP1));
  }
  const double h = r.st.threshold;
  char detail[96];
  if (r.st.cusum_error >= h) {
    std::snprintf(detail, sizeof detail, " (the primary fails %.1f%% of its requests)", p0 * 100.0);
    end_rollout(r, "error_rate", detail);
  } else if (r.st.cusum_ttft >= h) {
    std::snprintf(detail, sizeof detail, " (the primary's p99 is %.3f s)", p99(ref.ttft));
    end_rollout(r, "ttft_p99", detail);
  } else if (r.st.cusum_tpot >= h) {
    std::snprintf(detail, sizeof detail, " (the primary's p99 is %.4f s)", p99(ref.tpot));
    end_rollout(r, "tpot_p99", detail);
  }
}

void VariantGuard::test_shadow(Rollout& r) {
  if (!r.shadow) return;
  const engine::adaptive::ShadowSnapshot snap = r.shadow->snapshot();
  r.st.shadow_scored = snap.scored;
  r.st.shadow_kl_mean = snap.kl_mean;
  r.st.shadow_top1_mean = snap.top1_mean;
  if (snap.generation == r.shadow_seen) return;
  const auto fresh = r.shadow->recent(static_cast<size_t>(snap.generation - r.shadow_seen));
  r.shadow_seen = snap.generation;
  for (const engine::adaptive::ShadowSample& s : fresh) {
    r.st.cusum_kl = std::max(0.0, r.st.cusum_kl + llr(s.kl > cfg_.shadow_kl, kShadowP0, kShadowP1));
    if (r.st.cusum_kl >= r.st.threshold) {
      char detail[96];
      std::snprintf(detail, sizeof detail, " (mean KL %.3f nats per token over %zu recent answers)", snap.kl_mean,
                    snap.in_window);
      end_rollout(r, "shadow_kl", detail);
      return;
    }
  }
}

void VariantGuard::advance(Rollout& r, int64_t now_ns) {
  RolloutStatus& st = r.st;
  st.step_elapsed_s = static_cast<double>(now_ns - r.step_start_ns) / kNsPerS;
  // A step is promoted only after as many canary requests as the error test needs, on
  // average, to catch the regression it guards against (so that a failing canary is caught
  // at the share where it started, not promoted for want of traffic), and min_step_requests.
  st.step_requests_needed = std::max(cfg_.min_step_requests, requests_to_detect(st.plan.name, st.threshold));
  if (st.state != "running" || st.step_elapsed_s < st.plan.step_s || st.step_requests < st.step_requests_needed) {
    return;
  }
  const RolloutPlan& p = st.plan;
  ++promotions_[{p.name, p.variant}];
  if (st.step + 1 >= p.shares.size()) {
    st.state = "promoted";
    stop_shadow(r);
    METRO_LOG_INFO("rollout of %s done: %.0f%% of '%s'", id_of(p.name, p.variant).c_str(), p.shares.back() * 100.0,
                   p.name.c_str());
    return;
  }
  ++st.step;
  (void)registry_.set_split(p.name, p.variant, p.shares[st.step]);
  st.step_requests = 0;
  st.step_elapsed_s = 0.0;
  r.step_start_ns = now_ns;
  METRO_LOG_INFO("rollout of %s: step %zu of %zu, %.0f%% of '%s'", id_of(p.name, p.variant).c_str(), st.step + 1,
                 p.shares.size(), p.shares[st.step] * 100.0, p.name.c_str());
}

void VariantGuard::remember(const std::string& id, const std::string& tenant, const std::string& name,
                            const std::string& variant) {
  if (id.empty()) return;
  std::lock_guard lock(mu_);
  auto [it, fresh] = answers_.insert_or_assign(id, Answer{tenant, name, variant});
  if (!fresh) return;
  answer_order_.push_back(id);
  while (answer_order_.size() > kFeedbackMemory) {
    answers_.erase(answer_order_.front());
    answer_order_.pop_front();
  }
}

bool VariantGuard::feedback(const std::string& id, const std::string& tenant, bool good) {
  const int64_t now = now_ns();
  std::lock_guard lock(mu_);
  auto it = answers_.find(id);
  if (it == answers_.end() || it->second.tenant != tenant) return false;
  const Answer a = it->second;
  ++ratings_[{a.name, a.variant, good}];
  Reference& ref = reference_[a.name];
  if (a.variant.empty()) {
    push_bounded<uint8_t>(ref.bad_feedback, good ? 0 : 1, static_cast<size_t>(std::max(1, cfg_.reference_window)));
    return true;
  }
  auto r = rollouts_.find({a.name, a.variant});
  if (r == rollouts_.end() || r->second.st.state != "running") return true;
  double bad = 0;
  for (uint8_t b : ref.bad_feedback) bad += b;
  const double p0 = std::clamp((bad + 0.5) / (static_cast<double>(ref.bad_feedback.size()) + 1.0), 0.02, 0.5);
  const double p1 = std::min(0.95, std::max(2.0 * p0, p0 + 0.1));
  RolloutStatus& st = r->second.st;
  st.cusum_feedback = std::max(0.0, st.cusum_feedback + llr(!good, p0, p1));
  if (st.cusum_feedback >= st.threshold) {
    char detail[96];
    std::snprintf(detail, sizeof detail, " (the primary's answers are rated bad %.1f%% of the time)", p0 * 100.0);
    end_rollout(r->second, "feedback", detail);
  }
  advance(r->second, now);
  return true;
}

BreakerState VariantGuard::breaker_state(const std::string& name, const std::string& variant) {
  std::lock_guard lock(mu_);
  auto it = breakers_.find({name, variant});
  if (it == breakers_.end()) return BreakerState::kClosed;
  Breaker& b = it->second;
  if (b.state == BreakerState::kOpen && now_ns() >= b.open_until_ns) b.state = BreakerState::kHalfOpen;
  return b.state;
}

std::vector<RolloutStatus> VariantGuard::rollouts() const {
  std::lock_guard lock(mu_);
  std::vector<RolloutStatus> out;
  const int64_t now = now_ns();
  for (const auto& [key, r] : rollouts_) {
    out.push_back(r.st);
    if (r.st.state == "running") out.back().step_elapsed_s = static_cast<double>(now - r.step_start_ns) / kNsPerS;
    if (r.shadow) {
      const engine::adaptive::ShadowSnapshot snap = r.shadow->snapshot();
      out.back().shadow_scored = snap.scored;
      out.back().shadow_kl_mean = snap.kl_mean;
      out.back().shadow_top1_mean = snap.top1_mean;
    }
  }
  return out;
}

void VariantGuard::export_metrics(metrics::Exposition& e) const {
  std::lock_guard lock(mu_);
  const char* breaker_help = "A variant's circuit breaker: 0 closed, 1 half-open, 2 open.";
  e.declare("metro_breaker_state", metrics::Type::kGauge, breaker_help);
  const int64_t now = now_ns();
  for (const auto& m : registry_.all()) {
    BreakerState s = BreakerState::kClosed;
    if (auto it = breakers_.find({m->name, m->variant}); it != breakers_.end()) {
      s = it->second.state == BreakerState::kOpen && now >= it->second.open_until_ns ? BreakerState::kHalfOpen
                                                                                      : it->second.state;
    }
    e.gauge("metro_breaker_state", breaker_help,
            metrics::labels({{"model", m->name}, {"variant", m->variant.empty() ? "primary" : m->variant}}),
            static_cast<double>(s));
  }
  const char* rb_help = "Variants rolled back (share set to 0), by cause.";
  e.declare("metro_variant_rollbacks_total", metrics::Type::kCounter, rb_help);
  for (const auto& [k, n] : rollbacks_) {
    const auto& [name, variant, cause] = k;
    e.counter("metro_variant_rollbacks_total", rb_help,
              metrics::labels({{"model", name}, {"variant", variant}, {"cause", cause}}), static_cast<double>(n));
  }
  const char* pr_help = "Rollout steps a variant was promoted through.";
  e.declare("metro_variant_promotions_total", metrics::Type::kCounter, pr_help);
  for (const auto& [k, n] : promotions_) {
    e.counter("metro_variant_promotions_total", pr_help, metrics::labels({{"model", k.first}, {"variant", k.second}}),
              static_cast<double>(n));
  }
  const char* kl_help = "Mean KL (nats per output token) of a rolled-out variant's shadow-scored answers from its "
                        "primary's model, over the recent window.";
  const char* top1_help = "Share of output positions where a rolled-out variant's shadow-scored answers and its "
                          "primary's model agree on the most likely token, over the recent window.";
  e.declare("metro_variant_shadow_kl", metrics::Type::kGauge, kl_help);
  e.declare("metro_variant_shadow_top1", metrics::Type::kGauge, top1_help);
  for (const auto& [k, r] : rollouts_) {
    if (!r.st.shadow) continue;
    // A running rollout reads its scorer; an ended one keeps the last figures it read.
    const double kl = r.shadow ? r.shadow->snapshot().kl_mean : r.st.shadow_kl_mean;
    const double top1 = r.shadow ? r.shadow->snapshot().top1_mean : r.st.shadow_top1_mean;
    const std::string l = metrics::labels({{"model", k.first}, {"variant", k.second}});
    e.gauge("metro_variant_shadow_kl", kl_help, l, kl);
    e.gauge("metro_variant_shadow_top1", top1_help, l, top1);
  }
  const char* fb_help = "Ratings of a variant's answers sent to /v1/feedback.";
  e.declare("metro_variant_feedback_total", metrics::Type::kCounter, fb_help);
  for (const auto& [k, n] : ratings_) {
    const auto& [name, variant, good] = k;
    e.counter("metro_variant_feedback_total", fb_help,
              metrics::labels({{"model", name}, {"variant", variant.empty() ? "primary" : variant},
                               {"rating", good ? "good" : "bad"}}),
              static_cast<double>(n));
  }
  const char* f_help = "Faults injected into a variant's requests (--fault), by kind.";
  e.declare("metro_fault_injected_total", metrics::Type::kCounter, f_help);
  for (const auto& [k, n] : injected_) {
    const auto& [name, variant, kind] = k;
    e.counter("metro_fault_injected_total", f_help,
              metrics::labels({{"model", name}, {"variant", variant.empty() ? "primary" : variant}, {"kind", kind}}),
              static_cast<double>(n));
  }
}

}  // namespace metro::gateway
