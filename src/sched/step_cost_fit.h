// Online fit of the step cost model (StepCostModel) from the steps an engine ran.
//
// step time = fixed + per_token x (prompt tokens + decodes) + per_attention_pair x prompt
//             (query, key) pairs + per_decode_ctx x keys the decodes read
//
// Prompt tokens and decodes share one per-token coefficient (the matmuls cost the same per
// row); a decode's extra cost is attention over its context. A separate per-decode term was
// tried on a server trace (docs/scheduling.md, "Step cost model"): it trades places with the
// context term from one half of the trace to the other (decodes of a workload have similar
// contexts), so extrapolation to a new context mix was unreliable; the shared form's
// coefficients held within 10% across halves.
//
// Least squares with exponential forgetting (about the last 1 / (1 - forget) steps), a
// small ridge relative to each feature's scale, and non-negative coefficients (a term that
// comes out negative is dropped and the rest refitted).
#pragma once

#include <optional>

#include "sched/sla_scheduler.h"

namespace metro::sched {

class StepCostFit {
 public:
  explicit StepCostFit(double forget = 0.995) : forget_(forget) {}

  // One step: its wall time, prompt tokens, decodes, prompt (query, key) pairs (sum of
  // StepCostModel::pairs over its chunks), and keys read by its decodes (sum of pos + 1).
  void observe(double step_s, int prefill_tokens, int decode_seqs, double prefill_pairs, double decode_ctx);

  // The model fitted so far; empty until the per-token term is positive. Before
  // kMinStepsForTerms steps, a per-token cost alone (least squares through the origin).
  std::optional<StepCostModel> fit() const;

  static constexpr int64_t kMinStepsForTerms = 16;

  int64_t steps() const { return steps_; }

 private:
  static constexpr int kN = 4;  // 1, tokens, prefill pairs, decode keys
  double forget_;
  double xtx_[kN][kN] = {};
  double xty_[kN] = {};
  int64_t steps_ = 0;
};

}  // namespace metro::sched
