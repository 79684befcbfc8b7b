// How many drafted tokens each decoding sequence gets in a step (k = 0: none, the plain
// decode). A draft row costs compute; it pays only if it is accepted often enough, and
// what "often enough" means depends on the step: a lone decode on this CPU is bound by
// reading the weights, so a few extra rows are nearly free, while a step of 64 decodes is
// bound by arithmetic and an extra row costs about what it can give.
//
// The controller keeps two estimates:
// - acceptance: per sequence and draft source, the chance that a draft token is accepted
//   given the one before it was (decayed counts, pulled towards the source's rate over all
//   sequences), so the j-th token of a draft is accepted with probability a^j;
// - cost: an online least-squares fit of step time on (1, decodes, prompt tokens, draft
//   rows), with forgetting, so the marginal seconds of one draft row are measured, not assumed.
// A draft model's own passes cost time too: one pass per draft position for all the
// sequences drafting that far (a fixed part per pass and a part per sequence in it, which
// the proposer measures); a candidate token's marginal seconds include its share of them.
// Before its first draft the draft model reads the sequence's tokens (the prompt): the
// first token of a sequence's draft also bears that catch-up spread over the tokens the
// sequence is expected to still generate, so short answers to long prompts are not drafted for.
// It then fills the step greedily: all candidate draft tokens sorted by expected tokens
// (a^j), each taken while its expected tokens per marginal second are at least the step's
// expected tokens per second so far. Taking such a token raises the step's rate, so the
// rule maximises expected output tokens per second of the step, and turns drafting off by
// itself when the step is compute-bound or guesses are poor.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "engine/speculative/online_fit.h"
#include "engine/speculative/proposer.h"

namespace metro::engine::speculative {

struct DraftCandidate {
  uint64_t seq_id = 0;
  DraftSource source = DraftSource::kNone;
  int proposed = 0;  // tokens the proposer offered (the most k may be)
  int k = 0;         // out: tokens the step computes
  // A draft model's catch-up before this sequence's first draft (tokens), and the tokens the
  // sequence is expected to still generate, over which that one-time cost is spread.
  int catch_up = 0;
  int remaining = 0;
};

// What a step is, without drafts, for the cost estimate.
struct StepShape {
  int decode_seqs = 0;
  int prefill_tokens = 0;
  int draft_room = 0;  // draft rows the step's token budget leaves
  // The proposer's seconds per draft position, fixed and per sequence (zero for lookups).
  DraftCost draft_cost;
  // The last step's time without its drafts (and a draft model's passes), the cost scale
  // until the fit is trusted (0: unknown).
  double last_step_s = 0.0;
};

class DraftController {
 public:
  // Until the fit is trusted: a draft row costs this fraction of a step's fixed part (about
  // what it costs a single decode on a 2-core AVX2 machine with a 135M-parameter model, where
  // the fit finds 0.6-0.7 ms over a 4.7-4.9 ms step).
  static constexpr double kColdRowFraction = 0.15;

  DraftController();

  // Sets each candidate's k.
  void plan(std::span<DraftCandidate> candidates, const StepShape& shape);
  // After the step: a sequence's draft of k tokens from `source` had `accepted` accepted.
  void observe(uint64_t seq_id, DraftSource source, int k, int accepted);
  // A step's wall time and shape (draft rows included).
  void observe_step(double seconds, int decode_seqs, int prefill_tokens, int draft_rows);
  void forget(uint64_t seq_id);

  double acceptance(uint64_t seq_id, DraftSource source) const;
  // Fitted seconds of a step's fixed part and of one draft row (0 while unknown).
  double fixed_seconds() const;
  double draft_row_seconds() const;

 private:
  struct Counts {
    double accepted = 0.0;
    double rejected = 0.0;
  };
  static constexpr int kTerms = 4;  // 1, decodes, prompt tokens, draft rows
  bool solve(std::array<double, kTerms>* theta) const;
  double prior(DraftSource s) const;

  std::unordered_map<uint64_t, std::array<Counts, kNumDraftSources>> seqs_;
  std::array<Counts, kNumDraftSources> global_{};
  OnlineFit<kTerms> fit_;  // step seconds on (1, decodes, prompt tokens, draft rows)
  struct Item {
    double value;
    size_t candidate;
    int j;
  };
  std::vector<Item> items_;
  std::vector<int> reach_;  // candidates offering at least j tokens, by j
};

}  // namespace metro::engine::speculative
