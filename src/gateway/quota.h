// Tenant quotas (from the key file): tokens per minute and concurrent requests.
//
// Tokens per minute is a token bucket per tenant: it holds up to `burst_tokens` (default one
// minute's worth), refills continuously at tokens_per_minute / 60 per second and starts
// full. A request is charged prompt + max_tokens when admitted (what it may use at most);
// release() settles to what it used (refunds the rest), so a tenant is billed for real usage
// while a burst of long max_tokens cannot overshoot the quota. A request dearer than the
// whole bucket could never be charged: it is refused with 400 (request_exceeds_quota).
// A bucket was chosen over a sliding window because its state is two numbers and its
// Retry-After is exact: (cost - level) / rate.
//
// Over the quota: 429 with Retry-After. For concurrency it is the tenant's mean request
// duration divided by its in-flight count (when the next one should finish), at least 1 s.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_map>

#include "base/status.h"
#include "gateway/decision.h"

namespace metro::gateway {

struct TenantQuota {
  double tokens_per_minute = 0.0;  // 0: unlimited
  double burst_tokens = 0.0;       // bucket size; 0: tokens_per_minute
  int max_concurrent = 0;          // 0: unlimited
};

// Checks ranges; errors name the field.
Status validate(const TenantQuota& q);

class QuotaManager {
 public:
  explicit QuotaManager(TenantQuota default_quota = {});

  // Replaces a tenant's quota; its bucket keeps its level, clamped to the new size.
  void set_quota(const std::string& tenant, const TenantQuota& q);

  // Decides; an admitted request holds a concurrency slot and `cost_tokens` of the bucket
  // until release(). The same as enter() then charge().
  Decision admit(const std::string& tenant, int64_t cost_tokens, int64_t now_ns);
  // The first half, before the request's cost is known (before tokenizing): takes a
  // concurrency slot, and refuses a tenant whose bucket is empty. Admitted, the slot is
  // held until release() or leave().
  Decision enter(const std::string& tenant, int64_t now_ns);
  // The second half, for a tenant that entered: charges `cost_tokens`. Refused, the slot
  // is still held (leave() it).
  Decision charge(const std::string& tenant, int64_t cost_tokens, int64_t now_ns);
  // Gives back a slot that was never charged.
  void leave(const std::string& tenant, int64_t now_ns);
  // The request ended: frees its slot and settles the charge to `used_tokens` (negative:
  // unknown, the charge stands).
  void release(const std::string& tenant, int64_t charged_tokens, int64_t used_tokens, double duration_s,
               int64_t now_ns);

  struct TenantState {
    double bucket_tokens = 0.0;
    int in_flight = 0;
    double mean_duration_s = 0.0;
  };
  TenantState state(const std::string& tenant, int64_t now_ns);

 private:
  struct Tenant {
    TenantQuota quota;
    bool custom = false;
    double level = 0.0;
    int64_t refilled_ns = 0;
    bool started = false;
    int in_flight = 0;
    double mean_duration_s = 0.0;
  };
  Tenant& tenant_locked(const std::string& name);
  static double capacity(const TenantQuota& q);
  static void refill(Tenant& t, int64_t now_ns);

  TenantQuota default_;
  std::mutex mu_;
  std::unordered_map<std::string, Tenant> tenants_;
};

}  // namespace metro::gateway
