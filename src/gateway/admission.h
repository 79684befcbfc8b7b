// Admission control: decides, before any work, whether the engine can take a request in
// time (RELIABILITY.md items 26-28).
//
// Per class it keeps bounded queues (waiting requests and their prompt tokens) and predicts
// the request's time to first token from the work ahead of it:
//
//   predicted TTFT = (prompt tokens queued in this class and every class served before it
//                     + the request's own prompt) / measured prefill tokens per second
//                    + the current step time
//
// A request whose predicted TTFT exceeds `ttft_margin` x its class's TTFT objective (or its
// own deadline) is refused at once with 503 and a Retry-After of the time the queue needs to
// drain enough; a full queue likewise. The engine feeds measured rates (observe_prefill,
// observe_step) and releases a request from the queue when it leaves it (first token, abort).
#pragma once

#include <array>
#include <cstdint>
#include <mutex>

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
};

struct QueueState {
  std::array<int, sched::kNumSlaClasses> requests{};
  std::array<int64_t, sched::kNumSlaClasses> prompt_tokens{};
  double prefill_tokens_per_s = 0.0;
  double step_s = 0.0;
};

class AdmissionController {
 public:
  explicit AdmissionController(const AdmissionConfig& cfg);  // cfg must pass validate()

  // Decides; an admitted request counts as queued until release().
  Decision admit(const AdmissionRequest& r, int64_t now_ns);
  // The request left the queue (first token, finished, aborted or refused downstream).
  void release(sched::SlaClass c, int prompt_tokens);

  // Engine measurements: prefill tokens computed in a step of step_s seconds (steps without
  // prefill are not observations), and the time of every step.
  void observe_prefill(int prefill_tokens, double step_s);
  void observe_step(double step_s);

  // Predicted TTFT of a request of class c with this prompt, given the queue now.
  double predicted_ttft_s(sched::SlaClass c, int prompt_tokens) const;
  QueueState state() const;

 private:
  double predicted_ttft_locked(sched::SlaClass c, int prompt_tokens) const;
  int64_t tokens_ahead_locked(sched::SlaClass c) const;
  int requests_ahead_locked(sched::SlaClass c) const;
  Decision refuse(sched::SlaClass c, const char* reason, double retry_s);

  AdmissionConfig cfg_;
  mutable std::mutex mu_;
  QueueState q_;
};

}  // namespace metro::gateway
