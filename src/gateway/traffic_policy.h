// The traffic policy `metro serve` puts in front of its engine: tenant quotas first (429),
// then admission control on the class queues (503), both before any work is done
// (DESIGN.md, flow of a request, step 2). It is the glue between the server's admission
// hooks, the engine's step reports and the gateway's QuotaManager / AdmissionController:
//
//   admit()          the server asks, once per HTTP request, after tokenizing
//   first_token()    the request left the queue (first token out, or ended without one)
//   done()           the request ended; its unused token charge is refunded
//   observe_step()   every engine step: measured rates for the TTFT prediction
//
// Thread-safe: the server calls it from its worker and I/O threads, the engine from its own.
#pragma once
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "gateway/admission.h"
#include "gateway/quota.h"
#include "sched/sched_metrics.h"

namespace metro::gateway {

struct TrafficPolicyConfig {
  // Admission control on the class queues (predicted TTFT, queue bounds, deadlines). Off, only
  // quotas refuse: a conventional server that queues whatever comes.
  bool admission = true;
  AdmissionConfig admission_cfg;  // its `metrics` is ignored: see attach_metrics()
  TenantQuota default_quota;      // for tenants without their own (unlimited by default)
  std::vector<std::pair<std::string, TenantQuota>> tenant_quotas;
};

Status validate(const TrafficPolicyConfig& cfg);

struct TrafficRequest {
  std::string tenant;
  sched::SlaClass sla_class = sched::SlaClass::kStandard;
  int prompt_tokens = 0;      // over every prompt of the request
  // Of which the prefix cache holds (an estimate at arrival). Admission counts only the rest
  // as work to queue; quotas charge the whole prompt.
  int cached_prompt_tokens = 0;
  int64_t max_new_tokens = 0; // over every choice (max_tokens x choices)
  int64_t deadline_ns = 0;    // 0: none
};

class TrafficPolicy {
 public:
  explicit TrafficPolicy(const TrafficPolicyConfig& cfg);  // cfg must pass validate()

  // Where refusals are counted (the engine's registry, exported on /metrics); may be called
  // once the engine exists, before or while requests arrive.
  void attach_metrics(sched::SchedMetrics* m) { metrics_.store(m, std::memory_order_release); }

  Decision admit(const TrafficRequest& r, int64_t now_ns);
  void first_token(const TrafficRequest& r);
  void done(const TrafficRequest& r, int64_t used_tokens, double duration_s, int64_t now_ns);
  void observe_step(const engine::StepReport& rep);
  // Measures the engine once (a timed prefill of `n_tokens` prompt tokens, then one decode
  // step) and starts admission from that instead of AdmissionConfig's guesses. Also pages
  // the weights in before the first client. Returns the measured prompt tokens per second.
  Expected<double> calibrate(engine::Engine& eng, int n_tokens = 256);

  QueueState queue_state() const { return admission_.state(); }
  bool admission_enabled() const { return cfg_.admission; }

 private:
  static int64_t charge(const TrafficRequest& r) { return r.prompt_tokens + r.max_new_tokens; }
  // Prompt tokens the engine will compute: at least one (the last token always is).
  static int uncached(const TrafficRequest& r) {
    return std::max(std::min(r.prompt_tokens, 1), r.prompt_tokens - std::max(0, r.cached_prompt_tokens));
  }
  void count_refusal(sched::SlaClass c, const std::string& reason);

  TrafficPolicyConfig cfg_;
  AdmissionController admission_;
  QuotaManager quota_;
  std::atomic<sched::SchedMetrics*> metrics_{nullptr};
};

}  // namespace metro::gateway
