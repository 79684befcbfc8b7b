// Online fit of the step cost model (StepCostModel) from the steps an engine ran.
//
// step time = fixed + per_token x (prompt tokens + decodes) + per_attention_pair x prompt
//             (query, key) pairs + per_decode_ctx x keys the decodes read
//
// Prompt tokens and decodes share one per-token coefficient (the matmuls cost the same per
// row); a decode's extra cost is attention over its context. A separate per-decode term is
// not identifiable apart from the context term on a real workload (its decodes have similar
// contexts), so it would extrapolate badly to a new context mix; docs/scheduling.md ("Step
// cost model") has the comparison on a server trace.
//
// Least squares with exponential forgetting (about the last 1 / (1 - forget) steps), a
// small ridge relative to each feature's scale, and non-negative coefficients (a term that
// comes out negative is dropped and the rest refitted).
#pragma once

#include <optional>

#include <cstdint>

namespace metro::sched {

// Seconds one step takes: fixed + per_prefill_token x prompt tokens + per_decode_seq x
// decodes, plus attention, which grows with context: a prompt chunk of n tokens from
// position p scores n x p + n (n + 1) / 2 (query, key) pairs, a decode reads the keys of
// its whole context (p + 1). Without the attention terms a chunk late in a 2000-token
// prompt costs twice what the model says and a chunk of a short prompt less (on a loaded
// server attention is a large share of engine time: docs/scheduling.md, "Step cost
// model"). All zero: unknown.
struct StepCostModel {
  double fixed_s = 0.0;
  double per_prefill_token_s = 0.0;
  double per_decode_seq_s = 0.0;
  double per_attention_pair_s = 0.0;  // prompt chunks: per (query, key) pair
  double per_decode_ctx_s = 0.0;      // decodes: per key of the context
  bool known() const { return per_prefill_token_s > 0.0; }
  // Context-free form (attention counted at context 0).
  double step_s(int prefill_tokens, int decode_seqs) const {
    return fixed_s + per_prefill_token_s * prefill_tokens + per_decode_seq_s * decode_seqs;
  }
  static double pairs(int64_t n, int64_t pos) {
    const double nd = static_cast<double>(n);
    return nd * static_cast<double>(pos) + nd * (nd + 1.0) / 2.0;
  }
  // A chunk of n prompt tokens starting at position pos.
  double prefill_s(int64_t n, int64_t pos) const {
    return per_prefill_token_s * static_cast<double>(n) + per_attention_pair_s * pairs(n, pos);
  }
  // A decode whose new token sits at position pos (it attends to pos + 1 keys).
  double decode_s(int64_t pos) const {
    return per_decode_seq_s + per_decode_ctx_s * static_cast<double>(pos + 1);
  }
  // The longest chunk from position pos, at most cap tokens, that fits in `seconds`.
  int max_prefill(double seconds, int64_t pos, int cap) const;
};


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

// What one step did, in the step cost model's terms.
struct StepCostSample {
  double step_s = 0.0;
  int prefill_tokens = 0;      // tokens of prompt chunks (and of drafts being verified)
  int decode_seqs = 0;
  double prefill_pairs = 0.0;  // sum of StepCostModel::pairs over the chunks
  double decode_ctx = 0.0;     // keys the decodes read (sum of pos + 1)
};

// A StepCostFit refitted on a cadence: every step until the terms can be told apart, then
// every kRefitEvery steps (a fit is a small least-squares solve).
class StepCostTracker {
 public:
  static constexpr int64_t kRefitEvery = 32;
  // Returns true when the model changed.
  bool observe(const StepCostSample& s);
  const StepCostModel& model() const { return model_; }

 private:
  StepCostFit fit_;
  StepCostModel model_;
};

}  // namespace metro::sched
