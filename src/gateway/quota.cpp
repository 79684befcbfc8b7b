#include "gateway/quota.h"

#include <algorithm>
#include <cmath>

#include "base/check.h"

namespace metro::gateway {

namespace {
constexpr double kDurationAlpha = 0.2;  // EWMA weight of a finished request's duration
}

Status validate(const TenantQuota& q) {
  auto ok = [](double v) { return std::isfinite(v) && v >= 0.0; };
  if (!ok(q.tokens_per_minute)) return invalid_argument("quota: tokens_per_minute must be finite and >= 0");
  if (!ok(q.burst_tokens)) return invalid_argument("quota: burst_tokens must be finite and >= 0");
  if (q.max_concurrent < 0) return invalid_argument("quota: max_concurrent must be >= 0");
  return Status();
}

QuotaManager::QuotaManager(TenantQuota default_quota) : default_(default_quota) {
  METRO_CHECK_MSG(validate(default_).ok(), "QuotaManager: invalid default quota (call validate())");
}

double QuotaManager::capacity(const TenantQuota& q) {
  return q.burst_tokens > 0.0 ? q.burst_tokens : q.tokens_per_minute;
}

void QuotaManager::refill(Tenant& t, int64_t now_ns) {
  const double cap = capacity(t.quota);
  if (!t.started) {
    t.level = cap;
    t.refilled_ns = now_ns;
    t.started = true;
    return;
  }
  if (now_ns > t.refilled_ns) {
    const double dt = static_cast<double>(now_ns - t.refilled_ns) * 1e-9;
    t.level = std::min(cap, t.level + dt * t.quota.tokens_per_minute / 60.0);
    t.refilled_ns = now_ns;
  }
}

QuotaManager::Tenant& QuotaManager::tenant_locked(const std::string& name) {
  auto [it, fresh] = tenants_.try_emplace(name);
  if (fresh) it->second.quota = default_;
  return it->second;
}

void QuotaManager::set_quota(const std::string& tenant, const TenantQuota& q) {
  METRO_CHECK_MSG(validate(q).ok(), "QuotaManager::set_quota: invalid quota (call validate())");
  std::lock_guard lock(mu_);
  Tenant& t = tenant_locked(tenant);
  t.quota = q;
  t.custom = true;
  t.level = std::min(t.level, capacity(q));
}

Decision QuotaManager::admit(const std::string& tenant, int64_t cost_tokens, int64_t now_ns) {
  Decision d = enter(tenant, now_ns);
  if (!d.admit) return d;
  d = charge(tenant, cost_tokens, now_ns);
  if (!d.admit) leave(tenant, now_ns);
  return d;
}

Decision QuotaManager::enter(const std::string& tenant, int64_t now_ns) {
  std::lock_guard lock(mu_);
  Tenant& t = tenant_locked(tenant);
  refill(t, now_ns);
  if (t.quota.max_concurrent > 0 && t.in_flight >= t.quota.max_concurrent) {
    return Decision::reject(429, kReasonTenantConcurrency, t.mean_duration_s / std::max(1, t.in_flight));
  }
  if (t.quota.tokens_per_minute > 0.0 && t.level <= 0.0) {
    // Nothing costs less than a token: no need to know the cost to refuse it.
    return Decision::reject(429, kReasonTenantRate, (1.0 - t.level) / (t.quota.tokens_per_minute / 60.0));
  }
  ++t.in_flight;
  return Decision::admitted();
}

Decision QuotaManager::charge(const std::string& tenant, int64_t cost_tokens, int64_t now_ns) {
  std::lock_guard lock(mu_);
  Tenant& t = tenant_locked(tenant);
  refill(t, now_ns);
  if (t.quota.tokens_per_minute > 0.0) {
    const double cost = static_cast<double>(std::max<int64_t>(0, cost_tokens));
    if (cost > capacity(t.quota)) {
      // No wait would make room: the bucket never holds more than its capacity.
      Decision d = Decision::reject(400, kReasonOverQuotaBucket, 0.0);
      d.message = "this request may use up to " + std::to_string(std::max<int64_t>(0, cost_tokens)) +
                  " tokens (prompt + max_tokens x choices), more than your key's quota allows at once (" +
                  std::to_string(static_cast<int64_t>(capacity(t.quota))) + "); lower max_tokens or n";
      return d;
    }
    if (t.level < cost) {
      return Decision::reject(429, kReasonTenantRate, (cost - t.level) / (t.quota.tokens_per_minute / 60.0));
    }
    t.level -= cost;
  }
  return Decision::admitted();
}

void QuotaManager::leave(const std::string& tenant, int64_t now_ns) { release(tenant, 0, 0, -1.0, now_ns); }

void QuotaManager::release(const std::string& tenant, int64_t charged_tokens, int64_t used_tokens,
                           double duration_s, int64_t now_ns) {
  std::lock_guard lock(mu_);
  auto it = tenants_.find(tenant);
  if (it == tenants_.end()) return;
  Tenant& t = it->second;
  refill(t, now_ns);
  t.in_flight = std::max(0, t.in_flight - 1);
  if (t.quota.tokens_per_minute > 0.0) {
    // Settles to actual usage: refunds what was charged and not used, and debits usage
    // beyond the charge (the bucket may go below zero: later requests wait for it).
    const double charged = static_cast<double>(std::max<int64_t>(0, charged_tokens));
    const double used = used_tokens < 0 ? charged : static_cast<double>(used_tokens);
    t.level = std::min(capacity(t.quota), t.level + (charged - used));
  }
  if (std::isfinite(duration_s) && duration_s >= 0.0) {
    t.mean_duration_s = t.mean_duration_s == 0.0 ? duration_s
                                                 : t.mean_duration_s + kDurationAlpha * (duration_s - t.mean_duration_s);
  }
  // A tenant without a quota of its own and nothing in flight is at its default state
  // again once its bucket is full: forget it so unknown tenant names cannot grow the map.
  if (!t.custom && t.in_flight == 0 && t.level >= capacity(t.quota)) tenants_.erase(it);
}

QuotaManager::TenantState QuotaManager::state(const std::string& tenant, int64_t now_ns) {
  std::lock_guard lock(mu_);
  auto it = tenants_.find(tenant);
  if (it == tenants_.end()) return {capacity(default_), 0, 0.0};
  refill(it->second, now_ns);
  return {it->second.level, it->second.in_flight, it->second.mean_duration_s};
}

}  // namespace metro::gateway
