#include "gateway/admission.h"

#include <algorithm>
#include <cmath>
#include <string>

namespace metro::gateway {

using sched::SlaClass;

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
  for (int c = 0; c < sched::kNumSlaClasses; ++c) {
    const ClassQueueLimits& l = cfg.limits[static_cast<size_t>(c)];
    if (l.max_requests < 0 || l.max_prompt_tokens < 0) {
      return bad(std::string(sched::sla_class_name(static_cast<SlaClass>(c))) + ": queue bounds must be >= 0");
    }
  }
  if (!(std::isfinite(cfg.ttft_margin) && cfg.ttft_margin > 0.0)) return bad("ttft_margin must be > 0");
  if (!(std::isfinite(cfg.initial_prefill_tokens_per_s) && cfg.initial_prefill_tokens_per_s > 0.0)) {
    return bad("initial_prefill_tokens_per_s must be > 0");
  }
  if (!(std::isfinite(cfg.initial_step_s) && cfg.initial_step_s >= 0.0)) return bad("initial_step_s must be >= 0");
  if (!(cfg.ewma_alpha > 0.0 && cfg.ewma_alpha <= 1.0)) return bad("ewma_alpha must be in (0, 1]");
  return Status();
}

AdmissionController::AdmissionController(const AdmissionConfig& cfg) : cfg_(cfg) {
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

int64_t AdmissionController::shorter_or_equal(const std::map<int, int>& prompts, int64_t all,
                                              int prompt_tokens) const {
  if (!cfg_.shortest_first) return all;
  int64_t n = 0;
  for (const auto& [len, count] : prompts) {
    if (len > prompt_tokens) break;
    n += static_cast<int64_t>(len) * count;
  }
  return n;
}

int64_t AdmissionController::tokens_ahead_locked(SlaClass c, int prompt_tokens, const std::string& tenant) const {
  // Of its own class: all queued prompts (FIFO) or those no longer than its own.
  const size_t i = static_cast<size_t>(c);
  const auto& tenants = tenants_[i];
  if (!cfg_.tenant_fair_share) return shorter_or_equal(prompts_[i], q_.prompt_tokens[i], prompt_tokens);
  // Fair share interleaves tenants: another tenant's queue is ahead only up to what this
  // tenant has ahead of the request plus the request itself.
  int64_t own = 0;
  if (auto it = tenants.find(tenant); it != tenants.end()) {
    own = shorter_or_equal(it->second.prompts, it->second.prompt_tokens, prompt_tokens);
  }
  int64_t n = own;
  for (const auto& [name, tq] : tenants) {
    if (name == tenant) continue;
    n += std::min(shorter_or_equal(tq.prompts, tq.prompt_tokens, prompt_tokens), own + std::max(0, prompt_tokens));
  }
  return n;
}

bool AdmissionController::below_share_locked(SlaClass c, const std::string& tenant, double used, double bound,
                                             bool by_tokens) const {
  if (!cfg_.tenant_fair_share) return false;
  const auto& tenants = tenants_[static_cast<size_t>(c)];
  auto it = tenants.find(tenant);
  const size_t n = tenants.size() + (it == tenants.end() ? 1 : 0);
  if (n < 2) return false;
  const double mine = it == tenants.end() ? 0.0
                      : by_tokens         ? static_cast<double>(it->second.prompt_tokens)
                                          : static_cast<double>(it->second.requests);
  return mine + used <= bound / static_cast<double>(n);
}

int AdmissionController::requests_ahead_locked(SlaClass c) const {
  int n = 0;
  for (int k = 0; k < sched::kNumSlaClasses; ++k) {
    if (!cfg_.class_priority || k <= static_cast<int>(c)) n += q_.requests[static_cast<size_t>(k)];
  }
  return n;
}

double AdmissionController::predicted_ttft_locked(SlaClass c, int prompt_tokens, const std::string& tenant) const {
  const double own = std::max(0, prompt_tokens);
  if (!cfg_.class_priority) {
    int64_t all = 0;
    for (int64_t t : q_.prompt_tokens) all += t;
    return (static_cast<double>(all) + own) / std::max(kMinRate, q_.fifo_drain_tokens_per_s) + q_.step_s;
  }
  int64_t above = 0;
  for (int k = 0; k < static_cast<int>(c); ++k) above += q_.prompt_tokens[static_cast<size_t>(k)];
  const double drain = std::max(kMinRate, q_.drain_tokens_per_s[static_cast<size_t>(c)]);
  return static_cast<double>(above) / std::max(kMinRate, q_.prefill_tokens_per_s) +
         (static_cast<double>(tokens_ahead_locked(c, prompt_tokens, tenant)) + own) / drain + q_.step_s;
}

double AdmissionController::predicted_ttft_s(SlaClass c, int prompt_tokens, const std::string& tenant) const {
  std::lock_guard lock(mu_);
  return predicted_ttft_locked(c, prompt_tokens, tenant);
}

Decision AdmissionController::refuse(SlaClass c, const char* reason, double retry_s) {
  if (cfg_.metrics != nullptr) cfg_.metrics->observe_rejection(c, reason);
  return Decision::reject(503, reason, retry_s);
}

Decision AdmissionController::admit(const AdmissionRequest& r, int64_t now_ns) {
  std::lock_guard lock(mu_);
  const size_t k = static_cast<size_t>(r.sla_class);
  const ClassQueueLimits& lim = cfg_.limits[k];
  const int prompt = std::max(0, r.prompt_tokens);
  const double drain = std::max(kMinRate, cfg_.class_priority ? q_.drain_tokens_per_s[k] : q_.fifo_drain_tokens_per_s);

  // A full class still takes a tenant that holds less than its share of the bound, so one
  // tenant's flood cannot fill the queue for everybody (the overshoot is at most a share).
  if (q_.requests[k] >= lim.max_requests &&
      !below_share_locked(r.sla_class, r.tenant, 1.0, lim.max_requests, /*by_tokens=*/false)) {
    // A seat frees when the request at the head gets its first token: about the time the
    // queue ahead takes to drain, over the requests in it.
    const int n = std::max(1, requests_ahead_locked(r.sla_class));
    return refuse(r.sla_class, kReasonQueueFull, predicted_ttft_locked(r.sla_class, 0, r.tenant) / n);
  }
  if (q_.prompt_tokens[k] + prompt > lim.max_prompt_tokens &&
      !below_share_locked(r.sla_class, r.tenant, prompt, static_cast<double>(lim.max_prompt_tokens),
                          /*by_tokens=*/true)) {
    const double excess = static_cast<double>(q_.prompt_tokens[k] + prompt - lim.max_prompt_tokens);
    return refuse(r.sla_class, kReasonQueueTokens, excess / drain);
  }
  const double ttft = predicted_ttft_locked(r.sla_class, prompt, r.tenant);
  const double limit = cfg_.ttft_margin * cfg_.sla.of(r.sla_class).ttft_s;
  if (ttft > limit) {
    // When the queue ahead has drained by (ttft - limit) seconds of prefill, it would fit.
    return refuse(r.sla_class, kReasonTtft, ttft - limit);
  }
  if (r.deadline_ns > 0 && static_cast<double>(now_ns) + ttft * 1e9 > static_cast<double>(r.deadline_ns)) {
    const double late_s = (static_cast<double>(now_ns) + ttft * 1e9 - static_cast<double>(r.deadline_ns)) * 1e-9;
    return refuse(r.sla_class, kReasonDeadline, late_s);
  }
  ++q_.requests[k];
  q_.prompt_tokens[k] += prompt;
  ++prompts_[k][prompt];
  TenantQueue& tq = tenants_[k][r.tenant];
  ++tq.requests;
  tq.prompt_tokens += prompt;
  ++tq.prompts[prompt];
  return Decision::admitted();
}

void AdmissionController::release(SlaClass c, int prompt_tokens, const std::string& tenant) {
  std::lock_guard lock(mu_);
  const size_t k = static_cast<size_t>(c);
  const int prompt = std::max(0, prompt_tokens);
  // Clamped: a caller's miscount must not drive the queue negative and admit forever.
  q_.requests[k] = std::max(0, q_.requests[k] - 1);
  q_.prompt_tokens[k] = std::max<int64_t>(0, q_.prompt_tokens[k] - prompt);
  auto it = prompts_[k].find(prompt);
  if (it != prompts_[k].end() && --it->second == 0) prompts_[k].erase(it);
  if (q_.requests[k] == 0) prompts_[k].clear();
  if (auto t = tenants_[k].find(tenant); t != tenants_[k].end()) {
    TenantQueue& tq = t->second;
    tq.requests = std::max(0, tq.requests - 1);
    tq.prompt_tokens = std::max<int64_t>(0, tq.prompt_tokens - prompt);
    auto p = tq.prompts.find(prompt);
    if (p != tq.prompts.end() && --p->second == 0) tq.prompts.erase(p);
    if (tq.requests == 0) tenants_[k].erase(t);
  }
  if (q_.requests[k] == 0) tenants_[k].clear();
}

void AdmissionController::observe_step(const StepObservation& o) {
  if (!std::isfinite(o.step_s) || o.step_s <= 0.0) return;
  std::lock_guard lock(mu_);
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

void AdmissionController::calibrate(double prefill_tokens_per_s, double step_s) {
  if (!std::isfinite(prefill_tokens_per_s) || prefill_tokens_per_s <= 0.0) return;
  std::lock_guard lock(mu_);
  q_.prefill_tokens_per_s = prefill_tokens_per_s;
  q_.drain_tokens_per_s.fill(prefill_tokens_per_s);
  q_.fifo_drain_tokens_per_s = prefill_tokens_per_s;
  if (std::isfinite(step_s) && step_s >= 0.0) q_.step_s = step_s;
}

QueueState AdmissionController::state() const {
  std::lock_guard lock(mu_);
  return q_;
}

}  // namespace metro::gateway
