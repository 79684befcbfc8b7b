// What one engine step did, and the hook through which anything outside the step loop
// (admission control's rate estimates, the --step-trace file, a profiler) learns it. The
// step itself keeps no instrumentation; observers are called on the engine thread after
// each step, in the order they were added, and must be quick and never block.
#pragma once

#include <array>
#include <limits>

#include "base/sla.h"
#include "sched/step_cost_fit.h"

namespace metro::engine {

struct StepReport {
  sched::StepCostSample cost;  // time, prompt tokens, decodes, attention work
  int logit_rows = 0;          // rows the step computed logits for
  double attention_s = 0.0;    // of cost.step_s, the attention ops (a backends::StepProfile)
  int draft_tokens = 0;        // drafts verified in the step
  int accepted_tokens = 0;     // of which accepted
  std::array<int, kNumSlaClasses> prefill_tokens_by_class{};
  std::array<int, kNumSlaClasses> waiting_by_class{};  // after the step
  std::array<int, kNumSlaClasses> running_by_class{};
  // Output tokens the step gave sequences whose output had begun (decodes and their
  // accepted drafts; a first token is not counted), and how many sequences had begun and
  // not ended after it (running or paused): together the pace each class's output keeps.
  std::array<int, kNumSlaClasses> output_tokens_by_class{};
  std::array<int, kNumSlaClasses> begun_by_class{};
  // The adaptive controller's cap on admission's TTFT margin after this step (its strategy
  // table's high-load row; +infinity without a controller or below high load).
  double admission_ttft_margin_cap = std::numeric_limits<double>::infinity();
};

class StepObserver {
 public:
  virtual ~StepObserver() = default;
  virtual void on_step(const StepReport& report) = 0;
  // Whether it reads StepReport::attention_s. On a backend whose op timing is not cheap
  // (a device backend records an event around every op) the engine times the ops only
  // while some observer wants them; attention_s is 0 otherwise.
  virtual bool wants_op_times() const { return false; }
};

}  // namespace metro::engine
