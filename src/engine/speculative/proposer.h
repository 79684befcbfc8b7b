// Where speculative decoding's guesses come from. Before each step the engine asks the
// proposer for a continuation of every decoding sequence; the controller (controller.h)
// decides how many of those tokens the step computes; the step computes them with the
// sequence's next token and the sampler verifies them row by row. A draft is accepted only
// where the token sampled from the model's own processed distribution equals it, so the
// output is exactly what the model alone would produce: for greedy decoding the same
// tokens, for sampling the same distribution (with a seed, the same tokens: each row uses
// the next draw of the request's random stream, as a step without drafts would).
//
// This rule is exact for any proposer whose guess does not depend on the random stream
// (n-gram lookup, a request's predicted output, a greedy draft model): accepting a guess d
// when the sampled x equals d, and otherwise keeping x, draws x from p however d was
// chosen. It is rejection sampling with the proposer's distribution a point mass at d.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "sched/seq_state.h"

namespace metro {
class ThreadPool;
}

namespace metro::engine::speculative {

// Where a draft came from: the metrics' `proposer` label and the prediction usage count.
enum class DraftSource : uint8_t {
  kNone = 0,
  kPrediction,  // the request's `prediction` (OpenAI predicted outputs)
  kContext,     // n-gram lookup in the sequence's own prompt and output
  kPool,        // n-gram lookup in the pool shared by requests of the same cache scope
  kDraftModel,  // a smaller model with the same vocabulary (--spec draft)
  kSelf,        // the model itself with layers skipped (--spec self)
  kGrammar,     // tokens a request's grammar forces (jump-forward; always accepted)
};
inline constexpr int kNumDraftSources = 7;
// "none", "prediction", "ngram", "ngram_pool", "draft", "self", "grammar"
const char* draft_source_name(DraftSource s);

struct ProposeInput {
  uint64_t request_id = 0;
  const sched::SeqState* seq = nullptr;  // committed tokens in seq->tokens
  std::span<const int32_t> prediction;   // the request's predicted output; may be empty
};

// What drafting costs a proposer that runs a model: seconds per pass (one per draft
// position, shared by the sequences drafting that far) and per sequence in a pass.
struct DraftCost {
  double pass_s = 0.0;
  double seq_s = 0.0;
  double token_s = 0.0;  // per token the draft model must catch up on before it drafts
};

// One sequence's draft from a model proposer: k tokens asked for, `tokens` filled (fewer
// when the proposer cannot draft that far for it this step).
struct DraftJob {
  ProposeInput in;
  int k = 0;
  std::vector<int32_t>* tokens = nullptr;
};

class Proposer {
 public:
  virtual ~Proposer() = default;
  // Fills `out` (cleared by the caller) with at most k tokens likely to follow
  // in.seq->tokens and says where they came from. Called on the engine thread for every
  // decoding sequence each step; must be quick.
  virtual DraftSource propose(const ProposeInput& in, int k, std::vector<int32_t>& out) = 0;
  // The sequence ended (finished, aborted or preempted for good): forget what was kept for it.
  virtual void forget(uint64_t /*seq_id*/) {}

  // A proposer that runs a model drafts for every sequence at once, after the controller has
  // chosen each sequence's k from the acceptance it expects and what the passes cost
  // (propose() is then not called). Lookups return kNone here.
  virtual DraftSource model_source() const { return DraftSource::kNone; }
  // Called once by the engine before its first step, on its compute pool: a proposer that
  // runs a model times a few passes of its own so that cost() is known from the start.
  virtual void calibrate(ThreadPool& /*pool*/) {}
  virtual DraftCost cost() const { return {}; }
  // Tokens of the sequence the draft model has not read yet (its prompt, at first).
  virtual int catch_up(const ProposeInput& /*in*/) const { return 0; }
  virtual void draft(std::span<DraftJob> /*jobs*/, ThreadPool& /*pool*/) {}
};

}  // namespace metro::engine::speculative
