// Admission control for one engine: decides, before any work, whether the engine can take a
// request in time, so that what would time out late is refused early.
//
// Per class it keeps bounded queues (requests waiting for their first token and their
// prompt tokens) and predicts the request's time to first token from the work ahead of it,
// in the order of the engine's scheduling policy (sched::QueueOrder, which the policy
// supplies):
//
//   predicted TTFT = prompt tokens queued in classes served before its class
//                      / the engine's prefill rate (tokens per second of prefill work)
//                  + (prompt tokens of its own class ahead of it + its own prompt)
//                      / its class's drain rate (prefill tokens per second the class got
//                        while it had prompts waiting: what is left to it after the
//                        classes above, decodes included)
//                  + the current step time
//
// Without class priority (FIFO over all classes) every queued prompt is its own queue, drained
// at the rate of all classes together. A request whose predicted TTFT exceeds `ttft_margin` x its
// class's TTFT objective (its class's bound) or its own deadline is refused at once with 503
// and a Retry-After of the time the queue needs to drain enough; a full queue likewise. The
// engine feeds its measurements (observe_step) and releases a request from the queue when
// it leaves it (first token, abort).
//
// The prediction rests on averaged rates; what it cannot see (higher classes arriving
// faster than they did) shows in how long admitted requests actually wait. So a class whose
// oldest admitted request has waited past the class's bound without a first token takes no
// more requests until it has caught up (503 predicted_ttft_over_slo), and every admitted
// request carries a deadline of `shed_after` x its class's bound (shed_deadline_ns) and the
// same bound on a pause in its output (max_stall_ns): the engine ends one still without a
// first token by then, or without a new token for that long, with deadline_missed (a 503,
// or an error event in a stream already begun), so that no admitted request waits for
// output longer than that.
//
// The same holds for the pace of output once begun. The engine reports, per class, how
// many sequences have begun output and how many output tokens each step gave them; their
// ratio, averaged, is the seconds per output token the class's running requests get. A
// class whose running requests get slower than `ttft_margin` x its TPOT objective takes no
// more requests (503 tpot_over_slo) until they are back on pace or have ended: classes
// above it are taking the steps, and every request let in would slow the ones running.
#pragma once

#include <array>
#include <cstdint>
#include <limits>
#include <mutex>
#include <set>
#include <string>

#include <memory>

#include "base/sla.h"
#include "gateway/decision.h"
#include "sched/queue_order.h"

namespace metro::gateway {

struct ClassQueueLimits {
  int max_requests = 256;
  int64_t max_prompt_tokens = 256 * 1024;
};

struct AdmissionConfig {
  SlaConfig sla;
  // realtime 64 requests / 16k tokens, standard 256 / 256k, batch 1024 / 4M.
  std::array<ClassQueueLimits, kNumSlaClasses> limits = {
      ClassQueueLimits{64, 16 * 1024}, ClassQueueLimits{256, 256 * 1024}, ClassQueueLimits{1024, 4 * 1024 * 1024}};
  double ttft_margin = 1.0;  // refuse when predicted TTFT > margin x the class TTFT objective
  // An admitted request without a first token after shed_after x (ttft_margin x its class's
  // TTFT objective), or without a new token for that long, is ended (deadline_missed); 0:
  // never.
  double shed_after = 1.5;
  double initial_prefill_tokens_per_s = 400.0;  // until the engine has measured it
  double initial_step_s = 0.0;
  double ewma_alpha = 0.2;                      // weight of a new measurement
};

// Checks ranges; errors name the field.
Status validate(const AdmissionConfig& cfg);

struct QueueState {
  std::array<int, kNumSlaClasses> requests{};
  std::array<int64_t, kNumSlaClasses> prompt_tokens{};
  double prefill_tokens_per_s = 0.0;  // the engine's rate on prompt tokens
  std::array<double, kNumSlaClasses> drain_tokens_per_s{};  // per class, when backlogged
  // Per class, how long the oldest admitted request still without a first token has waited
  // (at the last admit() or state() call; 0 when none waits).
  std::array<double, kNumSlaClasses> oldest_wait_s{};
  double fifo_drain_tokens_per_s = 0.0;  // all classes together, when any is backlogged
  double step_s = 0.0;
  // Per class, seconds per output token its begun requests get (averaged over steps; 0
  // while it has none), and how many had begun at the last step.
  std::array<double, kNumSlaClasses> pace_s{};
  std::array<int, kNumSlaClasses> begun{};
};

// What the engine measured in one step.
struct StepObservation {
  double step_s = 0.0;
  // Prompt tokens computed per class, and the part of the step all prompt tokens took (e.g.
  // step time x prompt tokens / all tokens of the step).
  std::array<int, kNumSlaClasses> prefill_tokens{};
  double prefill_s = 0.0;
  // Whether the class had prompts waiting to start when the step began.
  std::array<bool, kNumSlaClasses> backlogged{};
  // Per class: output tokens the step gave sequences whose output had begun, and how many
  // such sequences there were (running or paused).
  std::array<int, kNumSlaClasses> output_tokens{};
  std::array<int, kNumSlaClasses> begun{};
  // The engine's adaptive controller at high load (engine/adaptive/tier_controller.h): a
  // cap on ttft_margin for the requests that come next, so that at a peak admission
  // refuses what is predicted to miss its objective instead of what would miss it by
  // ttft_margin times. +infinity: no cap. A promise already given (an admitted request's
  // shed deadline) keeps the configured margin.
  double ttft_margin_cap = std::numeric_limits<double>::infinity();
};

class AdmissionController {
 public:
  // cfg must pass validate(); `order` is the engine's (Engine::queue_order()).
  AdmissionController(const AdmissionConfig& cfg, std::shared_ptr<const sched::QueueOrder> order);

  // Decides for a prompt of `prompt_tokens` to compute ("" is a tenant like any other; a
  // deadline of 0 is none, else on the now_ns clock). An admitted request counts as queued
  // until release(), as admitted at `now_ns`.
  Decision admit(SlaClass c, int prompt_tokens, const std::string& tenant, int64_t deadline_ns, int64_t now_ns);
  // The request admitted at `admitted_ns` left the queue (first token, finished, aborted or
  // refused downstream).
  void release(SlaClass c, int prompt_tokens, const std::string& tenant, int64_t admitted_ns);
  // The deadline an admitted request of class c carries into the engine (0: none), given
  // the client's own (0: none).
  int64_t shed_deadline_ns(SlaClass c, int64_t admitted_ns, int64_t client_deadline_ns) const;
  // The longest an admitted request of class c may go without a new token once its output
  // has begun (the same shed_after x bound; 0: no bound).
  int64_t max_stall_ns(SlaClass c) const;

  // Every step's measurements (EWMA; the prefill rate moves only in steps with prompt
  // tokens; a class's drain rate moves to what it got in steps where it was backlogged, and
  // to the prefill rate in steps where neither it nor a class above it was; a class's pace
  // moves in steps where it had begun requests and starts afresh when it has none).
  void observe_step(const StepObservation& o);
  // Replaces the starting guesses with a measurement (e.g. a warm-up prefill at startup):
  // the prefill rate and every class's drain rate become `prefill_tokens_per_s`.
  void calibrate(double prefill_tokens_per_s, double step_s);

  // The margin admit() refuses past now: ttft_margin, or the engine's cap if lower.
  double effective_ttft_margin() const;

  // Predicted TTFT of a request of class c (and tenant) with this prompt, given the queue now.
  double predicted_ttft_s(SlaClass c, int prompt_tokens, const std::string& tenant = {}) const;
  // `now_ns` (0: the clock) dates oldest_wait_s.
  QueueState state(int64_t now_ns = 0) const;

 private:
  double predicted_ttft_locked(SlaClass c, int prompt_tokens, const std::string& tenant) const;
  // Whether the tenant holds less than its share of a full class's bound.
  bool below_share_locked(SlaClass c, const std::string& tenant, double used, double bound,
                          bool by_tokens) const;
  int requests_ahead_locked(SlaClass c) const;
  Decision refuse(const char* reason, double retry_s);

  AdmissionConfig cfg_;
  std::shared_ptr<const sched::QueueOrder> order_;
  mutable std::mutex mu_;
  QueueState q_;  // rates and per-class totals (kept in step with queues_)
  std::array<sched::ClassQueue, kNumSlaClasses> queues_;
  // Admission times of the requests each class holds, oldest first.
  std::array<std::multiset<int64_t>, kNumSlaClasses> admitted_at_;
  // Per class, averaged sequence-seconds of begun output and output tokens per step: their
  // ratio is the class's pace.
  std::array<double, kNumSlaClasses> pace_seq_s_{};
  std::array<double, kNumSlaClasses> pace_tokens_{};
  double margin_cap_ = std::numeric_limits<double>::infinity();  // StepObservation::ttft_margin_cap
};

}  // namespace metro::gateway
