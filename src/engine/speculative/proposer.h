// Where speculative decoding's guesses come from. Before each step the engine asks the
// proposer for a continuation of every decoding sequence; the step computes those draft
// tokens with the sequence's next token and the sampler verifies them row by row, so the
// output is exactly what the model alone would produce (a draft is accepted only where the
// sampled token equals it). Proposers differ in where guesses come from (n-gram lookup, a
// request's predicted output, a draft model); the engine does not know which one runs.
#pragma once

#include <cstdint>
#include <vector>

#include "sched/seq_state.h"

namespace metro::engine::speculative {

class Proposer {
 public:
  virtual ~Proposer() = default;
  // Fills `out` (cleared by the caller) with at most k tokens likely to follow seq.tokens.
  // `request_id` is the engine's id of the request the sequence belongs to. Called on the
  // engine thread; must be quick.
  virtual void propose(uint64_t request_id, const sched::SeqState& seq, int k, std::vector<int32_t>& out) = 0;
  // The request ended: forget what was kept for it.
  virtual void forget(uint64_t /*request_id*/) {}
};

}  // namespace metro::engine::speculative
