#include "gateway/admission.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>

#include "base/clock.h"

namespace metro::gateway {


Decision Decision::reject(int status, std::string reason, double retry_after_s) {
  Decision d;
  d.admit = false;
  d.http_status = status;
  d.reason = std::move(reason);
  d.retry_after_s = retry_after_seconds(retry_after_s);
  return d;
}

double retry_after_seconds(double estimate_s) {
  if (!std::isfinite(estimate_s)) return kMaxRetryAfterS;
  return std::clamp(std::ceil(estimate_s), 1.0, kMaxRetryAfterS);
}

Status validate(const AdmissionConfig& cfg) {
  auto bad = [](const std::string& m) { return invalid_argument("admission config: " + m); };
  for (int c = 0; c < kNumSlaClasses; ++c) {
    const ClassQueueLimits& l = cfg.limits[static_cast<size_t>(c)];
    if (l.max_requests < 0 || l.max_prompt_tokens < 0) {
      return bad(std::string(sla_class_name(static_cast<SlaClass>(c))) + ": queue bounds must be >= 0");
    }
  }
  if (!(std::isfinite(cfg.ttft_margin) && cfg.ttft_margin > 0.0)) return bad("ttft_margin must be > 0");
  if (!(std::isfinite(cfg.initial_prefill_tokens_per_s) && cfg.initial_prefill_tokens_per_s > 0.0)) {
    return bad("initial_prefill_tokens_per_s must be > 0");
  }
  if (!(std::isfinite(cfg.initial_step_s) && cfg.initial_step_s >= 0.0)) return bad("initial_step_s must be >= 0");
  if (!(cfg.ewma_alpha > 0.0 && cfg.ewma_alpha <= 1.0)) return bad("ewma_alpha must be in (0, 1]");
  if (!(std::isfinite(cfg.shed_after) && (cfg.shed_after == 0.0 || cfg.shed_after >= 1.0))) {
    return bad("shed_after must be 0 (never) or >= 1");
  }
  return Status();
}

AdmissionController::AdmissionController(const AdmissionConfig& cfg, std::shared_ptr<const sched::QueueOrder> order)
    : cfg_(cfg), order_(order ? std::move(order) : sched::fifo_queue_order()) {
  METRO_CHECK_MSG(validate(cfg_).ok(), "AdmissionController: invalid config (call validate())");
  q_.prefill_tokens_per_s = cfg_.initial_prefill_tokens_per_s;
  q_.drain_tokens_per_s.fill(cfg_.initial_prefill_tokens_per_s);
  q_.fifo_drain_tokens_per_s = cfg_.initial_prefill_tokens_per_s;
  q_.step_s = cfg_.initial_step_s;
}

namespace {
// A starved class drains at ~0 tokens/s: predictions become (near) infinite and requests are
// refused, which is right; the floor only keeps the arithmetic finite.
constexpr double kMinRate = 1e-3;
}  // namespace

bool AdmissionController::below_share_locked(SlaClass c, const std::string& tenant, double used, double bound,
                                             bool by_tokens) const {
  if (!order_->shares_between_tenants()) return false;
  const auto& tenants = queues_[static_cast<size_t>(c)].tenants;
  auto it = tenants.find(tenant);
  const size_t n = tenants.size() + (it == tenants.end() ? 1 : 0);
  if (n < 2) return false;
  const double mine = it == tenants.end() ? 0.0
                      : by_tokens         ? static_cast<double>(it->second.tokens)
                                          : static_cast<double>(it->second.requests);
  return mine + used <= bound / static_cast<double>(n);
}

int AdmissionController::requests_ahead_locked(SlaClass c) const {
  int n = 0;
  for (int k = 0; k < kNumSlaClasses; ++k) {
    if (!order_->by_class() || k <= static_cast<int>(c)) n += q_.requests[static_cast<size_t>(k)];
  }
  return n;
}

double AdmissionController::predicted_ttft_locked(SlaClass c, int prompt_tokens, const std::string& tenant) const {
  const double own = std::max(0, prompt_tokens);
  if (!order_->by_class()) {
    int64_t ahead = 0;
    for (const sched::ClassQueue& q : queues_) ahead += order_->tokens_ahead(q, prompt_tokens, tenant);
    return (static_cast<double>(ahead) + own) / std::max(kMinRate, q_.fifo_drain_tokens_per_s) + q_.step_s;
  }
  int64_t above = 0;
  for (int k = 0; k < static_cast<int>(c); ++k) above += q_.prompt_tokens[static_cast<size_t>(k)];
  const double drain = std::max(kMinRate, q_.drain_tokens_per_s[static_cast<size_t>(c)]);
  return static_cast<double>(above) / std::max(kMinRate, q_.prefill_tokens_per_s) +
         (static_cast<double>(order_->tokens_ahead(queues_[static_cast<size_t>(c)], prompt_tokens, tenant)) + own) /
             drain +
         q_.step_s;
}

double AdmissionController::predicted_ttft_s(SlaClass c, int prompt_tokens, const std::string& tenant) const {
  std::lock_guard lock(mu_);
  return predicted_ttft_locked(c, prompt_tokens, tenant);
}

Decision AdmissionController::refuse(const char* reason, double retry_s) {
  return Decision::reject(503, reason, retry_s);
}

Decision AdmissionController::admit(SlaClass cls, int prompt_tokens, const std::string& tenant, int64_t deadline_ns,
                                    int64_t now_ns) {
  std::lock_guard lock(mu_);
  const size_t k = static_cast<size_t>(cls);
  const ClassQueueLimits& lim = cfg_.limits[k];
  const int prompt = std::max(0, prompt_tokens);
  const double drain = std::max(kMinRate, order_->by_class() ? q_.drain_tokens_per_s[k] : q_.fifo_drain_tokens_per_s);
  // The request's own shape is judged by the configured margin (a prompt too long for its
  // class stays too long whatever the load); the queue by the margin the load allows now.
  const double shape_limit = cfg_.ttft_margin * cfg_.sla.of(cls).ttft_s;
  const double margin = std::min(cfg_.ttft_margin, margin_cap_);
  const double limit = margin * cfg_.sla.of(cls).ttft_s;

  // What no amount of waiting would let in is not load: 400 naming the bound, no Retry-After.
  if (prompt > lim.max_prompt_tokens) {
    Decision d = Decision::reject(400, kReasonOverQueueBound, 0.0);
    d.message = "the prompt's " + std::to_string(prompt) + " tokens exceed the " + sla_class_name(cls) +
                " queue's bound of " + std::to_string(lim.max_prompt_tokens) + " tokens; send less at once";
    return d;
  }
  const double idle_ttft = prompt / std::max(kMinRate, q_.prefill_tokens_per_s) + q_.step_s;
  if (idle_ttft > shape_limit) {
    Decision d = Decision::reject(400, kReasonTooLongForClass, 0.0);
    char buf[256];
    std::snprintf(buf, sizeof(buf),
                  "the prompt's %d tokens take about %.1f s to prefill even on an idle server, over the %s class's "
                  "bound on time to first token (%.1f s); use a lower class or a shorter prompt",
                  prompt, idle_ttft, sla_class_name(cls), shape_limit);
    d.message = buf;
    return d;
  }

  // A full class still takes a tenant that holds less than its share of the bound, so one
  // tenant's flood cannot fill the queue for everybody (the overshoot is at most a share).
  if (q_.requests[k] >= lim.max_requests &&
      !below_share_locked(cls, tenant, 1.0, lim.max_requests, /*by_tokens=*/false)) {
    // A seat frees when the request at the head gets its first token: about the time the
    // queue ahead takes to drain, over the requests in it.
    const int n = std::max(1, requests_ahead_locked(cls));
    return refuse(kReasonQueueFull, predicted_ttft_locked(cls, 0, tenant) / n);
  }
  if (q_.prompt_tokens[k] + prompt > lim.max_prompt_tokens &&
      !below_share_locked(cls, tenant, prompt, static_cast<double>(lim.max_prompt_tokens),
                          /*by_tokens=*/true)) {
    const double excess = static_cast<double>(q_.prompt_tokens[k] + prompt - lim.max_prompt_tokens);
    return refuse(kReasonQueueTokens, excess / drain);
  }
  // A class whose oldest admitted request has waited past the bound is behind what the
  // prediction promised: no more until it catches up, which happens by the time that
  // request gets its first token or is shed.
  if (const auto& at = admitted_at_[k]; !at.empty()) {
    const double waited = static_cast<double>(now_ns - *at.begin()) * 1e-9;
    if (waited > limit) {
      Decision d = refuse(kReasonTtft, cfg_.shed_after > 0.0 ? cfg_.shed_after * limit - waited : limit);
      char buf[256];
      std::snprintf(buf, sizeof(buf),
                    "the %s class is behind its time-to-first-token objective (a request admitted %.0f s ago is still "
                    "waiting); retry after %d s",
                    sla_class_name(cls), waited, static_cast<int>(d.retry_after_s));
      d.message = buf;
      return d;
    }
  }
  // Output that has begun but crawls is the same promise broken later: a class whose begun
  // requests are behind pace takes no more until they catch up or end.
  if (q_.begun[k] > 0) {
    const double pace_bound = margin * cfg_.sla.of(cls).tpot_s;
    if (q_.pace_s[k] > pace_bound) {
      // Room comes when about one of them ends: each has some dozens of tokens to go.
      Decision d = refuse(kReasonTpot, std::max(1.0, q_.pace_s[k] * 16.0));
      char buf[256];
      std::snprintf(buf, sizeof(buf),
                    "the %s class's running requests are behind their time-per-output-token objective (%.2f s per "
                    "token against %.2f s); retry after %d s",
                    sla_class_name(cls), q_.pace_s[k], pace_bound, static_cast<int>(d.retry_after_s));
      d.message = buf;
      return d;
    }
  }
  const double ttft = predicted_ttft_locked(cls, prompt, tenant);
  if (ttft > limit) {
    // When the queue ahead has drained by (ttft - limit) seconds of prefill, it would fit.
    return refuse(kReasonTtft, ttft - limit);
  }
  if (deadline_ns > 0 && static_cast<double>(now_ns) + ttft * 1e9 > static_cast<double>(deadline_ns)) {
    const double late_s = (static_cast<double>(now_ns) + ttft * 1e9 - static_cast<double>(deadline_ns)) * 1e-9;
    return refuse(kReasonDeadline, late_s);
  }
  queues_[k].add(tenant, prompt);
  admitted_at_[k].insert(now_ns);
  q_.requests[k] = queues_[k].requests;
  q_.prompt_tokens[k] = queues_[k].tokens;
  return Decision::admitted();
}

void AdmissionController::release(SlaClass c, int prompt_tokens, const std::string& tenant, int64_t admitted_ns) {
  std::lock_guard lock(mu_);
  const size_t k = static_cast<size_t>(c);
  queues_[k].remove(tenant, prompt_tokens);
  if (auto it = admitted_at_[k].find(admitted_ns); it != admitted_at_[k].end()) admitted_at_[k].erase(it);
  q_.requests[k] = queues_[k].requests;
  q_.prompt_tokens[k] = queues_[k].tokens;
}

int64_t AdmissionController::max_stall_ns(SlaClass c) const {
  if (cfg_.shed_after <= 0.0) return 0;
  // shed_after x the class's bound (capped so the product stays in range).
  const double bound_s = cfg_.shed_after * cfg_.ttft_margin * cfg_.sla.of(c).ttft_s;
  return static_cast<int64_t>(std::min(bound_s, 1e9) * 1e9);
}

int64_t AdmissionController::shed_deadline_ns(SlaClass c, int64_t admitted_ns, int64_t client_deadline_ns) const {
  if (cfg_.shed_after <= 0.0) return client_deadline_ns;
  const int64_t shed = admitted_ns + max_stall_ns(c);
  return client_deadline_ns > 0 ? std::min(client_deadline_ns, shed) : shed;
}

void AdmissionController::observe_step(const StepObservation& o) {
  if (!std::isfinite(o.step_s) || o.step_s <= 0.0) return;
  std::lock_guard lock(mu_);
  margin_cap_ = o.ttft_margin_cap > 0.0 ? o.ttft_margin_cap : std::numeric_limits<double>::infinity();
  const double a = cfg_.ewma_alpha;
  q_.step_s += a * (o.step_s - q_.step_s);
  int total = 0;
  bool any_backlog = false;
  for (size_t k = 0; k < o.prefill_tokens.size(); ++k) {
    const int t = std::max(0, o.prefill_tokens[k]);
    total += t;
    any_backlog = any_backlog || o.backlogged[k];
    if (o.backlogged[k]) q_.drain_tokens_per_s[k] += a * (t / o.step_s - q_.drain_tokens_per_s[k]);
  }
  if (any_backlog) q_.fifo_drain_tokens_per_s += a * (total / o.step_s - q_.fifo_drain_tokens_per_s);
  for (size_t k = 0; k < o.begun.size(); ++k) {
    const int begun = std::max(0, o.begun[k]);
    const int tokens = std::max(0, o.output_tokens[k]);
    if (begun == 0 && tokens == 0) {
      pace_seq_s_[k] = pace_tokens_[k] = 0.0;
      q_.pace_s[k] = 0.0;
    } else {
      // A class's first step with begun requests starts the averages as if each got a
      // token in it (on pace at this step time); later steps move them.
      const double seq_s = begun * o.step_s;
      if (pace_seq_s_[k] == 0.0) {
        pace_seq_s_[k] = seq_s;
        pace_tokens_[k] = std::max(begun, tokens);
      } else {
        pace_seq_s_[k] += a * (seq_s - pace_seq_s_[k]);
        pace_tokens_[k] += a * (tokens - pace_tokens_[k]);
      }
      // A class given no tokens for long reads as far behind, not as a division by zero.
      q_.pace_s[k] = pace_seq_s_[k] / std::max(pace_tokens_[k], 1e-6);
    }
    q_.begun[k] = begun;
  }
  if (total > 0 && std::isfinite(o.prefill_s) && o.prefill_s > 0.0) {
    q_.prefill_tokens_per_s += a * (total / o.prefill_s - q_.prefill_tokens_per_s);
    // A class that had nothing waiting, below no backlogged class, would have had the whole
    // prefill rate: its drain estimate follows that instead of staying at its initial guess
    // (a quiet realtime class must not be judged by the configured start value forever).
    bool above_backlogged = false;
    for (size_t k = 0; k < o.prefill_tokens.size(); ++k) {
      if (!o.backlogged[k] && !above_backlogged) {
        q_.drain_tokens_per_s[k] += a * (q_.prefill_tokens_per_s - q_.drain_tokens_per_s[k]);
      }
      above_backlogged = above_backlogged || o.backlogged[k];
    }
  }
}

double AdmissionController::effective_ttft_margin() const {
  std::lock_guard lock(mu_);
  return std::min(cfg_.ttft_margin, margin_cap_);
}

void AdmissionController::calibrate(double prefill_tokens_per_s, double step_s) {
  if (!std::isfinite(prefill_tokens_per_s) || prefill_tokens_per_s <= 0.0) return;
  std::lock_guard lock(mu_);
  q_.prefill_tokens_per_s = prefill_tokens_per_s;
  q_.drain_tokens_per_s.fill(prefill_tokens_per_s);
  q_.fifo_drain_tokens_per_s = prefill_tokens_per_s;
  if (std::isfinite(step_s) && step_s >= 0.0) q_.step_s = step_s;
}

QueueState AdmissionController::state(int64_t now) const {
  if (now == 0) now = now_ns();
  std::lock_guard lock(mu_);
  QueueState s = q_;
  for (size_t k = 0; k < admitted_at_.size(); ++k) {
    s.oldest_wait_s[k] = admitted_at_[k].empty() ? 0.0 : static_cast<double>(now - *admitted_at_[k].begin()) * 1e-9;
  }
  return s;
}

}  // namespace metro::gateway
