// Admission control: decides, before any work, whether the engine can take a request in
// time (RELIABILITY.md items 26-28).
//
// Per class it keeps bounded queues (requests waiting for their first token and their
// prompt tokens) and predicts the request's time to first token from the work ahead of it,
// in the scheduler's order:
//
//   predicted TTFT = prompt tokens queued in classes served before its class
//                      / the engine's prefill rate (tokens per second of prefill work)
//                  + (prompt tokens of its own class ahead of it + its own prompt)
//                      / its class's drain rate (prefill tokens per second the class got
//                        while it had prompts waiting: what is left to it after the
//                        classes above, decodes included)
//                  + the current step time
//
// "Ahead in its own class" is every queued prompt under FIFO, the prompts no longer than
// its own under shortest-first. A request whose predicted TTFT exceeds `ttft_margin` x its
// class's TTFT objective (or its own deadline) is refused at once with 503 and a
// Retry-After of the time the queue needs to drain enough; a full queue likewise. The
// engine feeds its measurements (observe_step) and releases a request from the queue when
// it leaves it (first token, abort).
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>

#include "gateway/decision.h"
#include "sched/sched_metrics.h"
#include "sched/seq_state.h"
#include "sched/sla_config.h"

namespace metro::gateway {

struct ClassQueueLimits {
  int max_requests = 256;
  int64_t max_prompt_tokens = 256 * 1024;
};

struct AdmissionConfig {
  sched::SlaConfig sla;
  // realtime 64 requests / 16k tokens, standard 256 / 256k, batch 1024 / 4M.
  std::array<ClassQueueLimits, sched::kNumSlaClasses> limits = {
      ClassQueueLimits{64, 16 * 1024}, ClassQueueLimits{256, 256 * 1024}, ClassQueueLimits{1024, 4 * 1024 * 1024}};
  double ttft_margin = 1.0;  // refuse when predicted TTFT > margin x the class TTFT objective
  // True for the SLA scheduler (a class waits only behind itself and classes above it);
  // false for FCFS (every queued token is ahead).
  bool class_priority = true;
  // True for the SLA scheduler's shortest-first order inside a class: of its own class, only
  // the queued prompts no longer than the request's are ahead of it. (Remaining-output
  // predictions also enter that order; prompt length is what the gateway knows.)
  bool shortest_first = true;
  // True for the SLA scheduler's fair share between tenants (VTC): of its own class, another
  // tenant's queued prompts are ahead of a request only up to as much as its own tenant has
  // ahead of it plus itself (the scheduler interleaves tenants), so a flood does not make
  // admission refuse a quiet tenant. The class's queue bounds likewise: while a class is full,
  // a tenant holding less than its share of them (bound / tenants queued) is still admitted.
  bool tenant_fair_share = true;
  double initial_prefill_tokens_per_s = 400.0;  // until the engine has measured it
  double initial_step_s = 0.0;
  double ewma_alpha = 0.2;                      // weight of a new measurement
  sched::SchedMetrics* metrics = nullptr;       // rejections are counted here when set
};

// Checks ranges; errors name the field.
Status validate(const AdmissionConfig& cfg);

struct AdmissionRequest {
  sched::SlaClass sla_class = sched::SlaClass::kStandard;
  int prompt_tokens = 0;
  int64_t deadline_ns = 0;  // 0: none; else the same clock as now_ns
  std::string tenant;       // "" is a tenant like any other (a server without keys has one)
};

struct QueueState {
  std::array<int, sched::kNumSlaClasses> requests{};
  std::array<int64_t, sched::kNumSlaClasses> prompt_tokens{};
  double prefill_tokens_per_s = 0.0;  // the engine's rate on prompt tokens
  std::array<double, sched::kNumSlaClasses> drain_tokens_per_s{};  // per class, when backlogged
  double fifo_drain_tokens_per_s = 0.0;  // all classes together, when any is backlogged
  double step_s = 0.0;
};

// What the engine measured in one step.
struct StepObservation {
  double step_s = 0.0;
  // Prompt tokens computed per class, and the part of the step all prompt tokens took (e.g.
  // step time x prompt tokens / all tokens of the step).
  std::array<int, sched::kNumSlaClasses> prefill_tokens{};
  double prefill_s = 0.0;
  // Whether the class had prompts waiting to start when the step began.
  std::array<bool, sched::kNumSlaClasses> backlogged{};
};

class AdmissionController {
 public:
  explicit AdmissionController(const AdmissionConfig& cfg);  // cfg must pass validate()

  // Decides; an admitted request counts as queued until release().
  Decision admit(const AdmissionRequest& r, int64_t now_ns);
  // The request left the queue (first token, finished, aborted or refused downstream).
  void release(sched::SlaClass c, int prompt_tokens, const std::string& tenant = {});

  // Every step's measurements (EWMA; the prefill rate moves only in steps with prompt
  // tokens; a class's drain rate moves to what it got in steps where it was backlogged, and
  // to the prefill rate in steps where neither it nor a class above it was).
  void observe_step(const StepObservation& o);
  // Replaces the starting guesses with a measurement (e.g. a warm-up prefill at startup):
  // the prefill rate and every class's drain rate become `prefill_tokens_per_s`.
  void calibrate(double prefill_tokens_per_s, double step_s);

  // Predicted TTFT of a request of class c (and tenant) with this prompt, given the queue now.
  double predicted_ttft_s(sched::SlaClass c, int prompt_tokens, const std::string& tenant = {}) const;
  QueueState state() const;

 private:
  struct TenantQueue {
    int requests = 0;
    int64_t prompt_tokens = 0;
    std::map<int, int> prompts;  // queued prompt lengths -> count
  };
  double predicted_ttft_locked(sched::SlaClass c, int prompt_tokens, const std::string& tenant) const;
  int64_t tokens_ahead_locked(sched::SlaClass c, int prompt_tokens, const std::string& tenant) const;
  // Queued prompt tokens no longer than `prompt_tokens` (all of them without shortest-first).
  int64_t shorter_or_equal(const std::map<int, int>& prompts, int64_t all, int prompt_tokens) const;
  // Whether the tenant holds less than its share of a full class's bound.
  bool below_share_locked(sched::SlaClass c, const std::string& tenant, double used, double bound,
                          bool by_tokens) const;
  int requests_ahead_locked(sched::SlaClass c) const;
  Decision refuse(sched::SlaClass c, const char* reason, double retry_s);

  AdmissionConfig cfg_;
  mutable std::mutex mu_;
  QueueState q_;
  // Queued prompt lengths per class (at most the class's request bound of them).
  std::array<std::map<int, int>, sched::kNumSlaClasses> prompts_;
  // The same per tenant (entries leave when a tenant has nothing queued).
  std::array<std::map<std::string, TenantQueue, std::less<>>, sched::kNumSlaClasses> tenants_;
};

}  // namespace metro::gateway
