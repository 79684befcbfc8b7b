#include "engine/speculative/controller.h"

#include <algorithm>
#include <cmath>

namespace metro::engine::speculative {

namespace {

constexpr double kSeqDecay = 0.85;     // per observation of a sequence
constexpr double kGlobalDecay = 0.995;  // per observation over all sequences
constexpr double kPriorWeight = 1.0;   // the source's rate counts as this many draft tokens
constexpr double kCostForget = 0.995;  // per step, in the cost fit
constexpr int64_t kMinSteps = 24;      // steps before the cost fit is trusted
constexpr double kModelDraftMargin = 1.25;  // a draft model's token must pay this much over its cost

}  // namespace

DraftController::DraftController() : fit_(kCostForget) {}

double DraftController::prior(DraftSource s) const {
  const Counts& g = global_[static_cast<size_t>(s)];
  return (g.accepted + 1.0) / (g.accepted + g.rejected + 2.0);
}

double DraftController::acceptance(uint64_t seq_id, DraftSource source) const {
  const double p = prior(source);
  auto it = seqs_.find(seq_id);
  if (it == seqs_.end()) return p;
  const Counts& c = it->second[static_cast<size_t>(source)];
  return (c.accepted + kPriorWeight * p) / (c.accepted + c.rejected + kPriorWeight);
}

void DraftController::observe(uint64_t seq_id, DraftSource source, int k, int accepted) {
  if (k <= 0 || source == DraftSource::kNone) return;
  const double a = static_cast<double>(std::clamp(accepted, 0, k));
  // A draft is a run of Bernoulli trials that stops at the first rejection: `accepted`
  // successes, then one failure unless every token was accepted.
  const double r = accepted < k ? 1.0 : 0.0;
  Counts& c = seqs_[seq_id][static_cast<size_t>(source)];
  c.accepted = c.accepted * kSeqDecay + a;
  c.rejected = c.rejected * kSeqDecay + r;
  Counts& g = global_[static_cast<size_t>(source)];
  g.accepted = g.accepted * kGlobalDecay + a;
  g.rejected = g.rejected * kGlobalDecay + r;
}

void DraftController::forget(uint64_t seq_id) { seqs_.erase(seq_id); }

void DraftController::observe_step(double seconds, int decode_seqs, int prefill_tokens, int draft_rows) {
  if (!(seconds > 0.0) || !std::isfinite(seconds)) return;
  fit_.add({1.0, static_cast<double>(decode_seqs), static_cast<double>(prefill_tokens), static_cast<double>(draft_rows)},
           seconds);
}

bool DraftController::solve(std::array<double, kTerms>* theta) const {
  return fit_.seen() >= kMinSteps && fit_.solve(theta);
}

double DraftController::fixed_seconds() const {
  std::array<double, kTerms> t{};
  return solve(&t) ? t[0] : 0.0;
}

double DraftController::draft_row_seconds() const {
  std::array<double, kTerms> t{};
  return solve(&t) ? t[3] : 0.0;
}

void DraftController::plan(std::span<DraftCandidate> candidates, const StepShape& shape) {
  for (DraftCandidate& c : candidates) c.k = 0;
  if (candidates.empty() || shape.draft_room <= 0) return;
  const bool model_drafts = shape.draft_cost.pass_s > 0.0 || shape.draft_cost.seq_s > 0.0;
  // Seconds of the step without drafts and of one draft row.
  double step, row;
  std::array<double, kTerms> t{};
  if (solve(&t) && t[0] > 0.0) {
    step = t[0] + std::max(0.0, t[1]) * shape.decode_seqs + std::max(0.0, t[2]) * shape.prefill_tokens;
    // Never free: a fit that finds draft rows cheaper than 1% of the fixed part is noise.
    row = std::max(t[3], 0.01 * t[0]);
  } else if (model_drafts) {
    // A draft model's costs are in seconds: scale by the last step until the fit is trusted.
    if (!(shape.last_step_s > 0.0)) return;
    step = shape.last_step_s;
    row = kColdRowFraction * step;
  } else {
    step = 1.0;
    row = kColdRowFraction;
  }
  items_.clear();
  reach_.assign(1, 0);
  for (size_t i = 0; i < candidates.size(); ++i) {
    const double a = acceptance(candidates[i].seq_id, candidates[i].source);
    double v = 1.0;
    if (static_cast<int>(reach_.size()) <= candidates[i].proposed) reach_.resize(static_cast<size_t>(candidates[i].proposed) + 1, 0);
    for (int j = 1; j <= candidates[i].proposed; ++j) {
      v *= a;
      items_.push_back(Item{v, i, j});
      ++reach_[static_cast<size_t>(j)];
    }
  }
  // Highest expected tokens first; a sequence's tokens in order (a^j falls with j).
  std::sort(items_.begin(), items_.end(), [](const Item& x, const Item& y) {
    return x.value != y.value ? x.value > y.value : x.j < y.j;
  });
  double tokens = std::max(1, shape.decode_seqs);
  int room = shape.draft_room;
  for (const Item& it : items_) {
    if (room <= 0) break;
    // The draft model's pass at position j is shared by the sequences drafting that far:
    // each candidate that could reach it bears an equal share of its fixed part.
    const DraftCandidate& cand = candidates[it.candidate];
    double cost = row + shape.draft_cost.seq_s + shape.draft_cost.pass_s / std::max(1, reach_[static_cast<size_t>(it.j)]);
    if (it.j == 1 && cand.catch_up > 0) {
      cost += shape.draft_cost.token_s * cand.catch_up / std::max(1, cand.remaining);
    }
    // A draft model's token must beat the step's rate by a margin: its cost is the sum of
    // several estimates, and where it only just pays the error decides.
    if (it.value * step < (model_drafts ? kModelDraftMargin : 1.0) * tokens * cost) {
      if (model_drafts) continue;  // a later, cheaper share may still pay
      break;
    }
    DraftCandidate& c = candidates[it.candidate];
    if (it.j != c.k + 1) continue;  // only after the draft's earlier tokens
    c.k = it.j;
    tokens += it.value;
    step += cost;
    --room;
  }
}

}  // namespace metro::engine::speculative
