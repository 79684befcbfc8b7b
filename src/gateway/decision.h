// What the gateway answers for one request, before any work is done for it: the one
// decision type of every gateway policy (quotas, admission, the front door).
#pragma once

#include <memory>
#include <string>

namespace metro::gateway {

// Reason codes (stable strings: they label metrics and go into the error body's `code`).
inline constexpr const char* kReasonQueueFull = "queue_full";              // 503: class queue at its request bound
inline constexpr const char* kReasonQueueTokens = "queue_tokens_full";     // 503: class queue at its prompt-token bound
inline constexpr const char* kReasonTtft = "predicted_ttft_over_slo";      // 503: would miss its TTFT objective
inline constexpr const char* kReasonTpot = "tpot_over_slo";                // 503: its class's output is behind pace
inline constexpr const char* kReasonDeadline = "deadline_unreachable";     // 503: would miss its own deadline
inline constexpr const char* kReasonTenantRate = "tenant_tokens_per_minute"; // 429: over the token quota
inline constexpr const char* kReasonTenantConcurrency = "tenant_concurrency"; // 429: too many in flight
inline constexpr const char* kReasonOverloaded = "overloaded";              // 503: the server's bound on choices
// Requests no amount of waiting would let in: 400, not load.
inline constexpr const char* kReasonOverQuotaBucket = "request_exceeds_quota";     // 400: dearer than the whole bucket
inline constexpr const char* kReasonOverQueueBound = "prompt_exceeds_queue_bound";  // 400: larger than its class queue
inline constexpr const char* kReasonTooLongForClass = "prompt_too_long_for_class";  // 400: misses the TTFT even idle

class Call;

struct Decision {
  bool admit = true;
  // 429 (the tenant is over its quota), 503 (the server is full, for now) or 400 (the
  // request can never be admitted as it is: no Retry-After)
  int http_status = 200;
  std::string reason;        // one of the codes above when refused
  double retry_after_s = 0;  // whole seconds >= 1 when refused (the Retry-After header)
  std::string message;       // for the client, when refused (the front door writes it)
  // The admitted request, from the front door (FrontDoor::admit); null from lower policies.
  std::shared_ptr<Call> call;

  static Decision admitted() { return {}; }
  static Decision reject(int status, std::string reason, double retry_after_s);
};

// Retry-After is whole seconds: rounds up, at least 1, at most kMaxRetryAfterS.
inline constexpr double kMaxRetryAfterS = 3600.0;
double retry_after_seconds(double estimate_s);

}  // namespace metro::gateway
