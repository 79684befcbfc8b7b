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
// Until the fit is trusted: a draft row costs this fraction of a step's fixed part (about
// what it costs a single decode on a 2-core AVX2 machine with a 135M-parameter model, where
// the fit finds 0.6-0.7 ms over a 4.7-4.9 ms step).
constexpr double kColdRowFraction = 0.15;

}  // namespace

DraftController::DraftController() = default;

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
  const std::array<double, kTerms> x = {1.0, static_cast<double>(decode_seqs), static_cast<double>(prefill_tokens),
                                        static_cast<double>(draft_rows)};
  for (int i = 0; i < kTerms; ++i) {
    for (int j = 0; j < kTerms; ++j) {
      xtx_[static_cast<size_t>(i)][static_cast<size_t>(j)] =
          xtx_[static_cast<size_t>(i)][static_cast<size_t>(j)] * kCostForget +
          x[static_cast<size_t>(i)] * x[static_cast<size_t>(j)];
    }
    xty_[static_cast<size_t>(i)] = xty_[static_cast<size_t>(i)] * kCostForget + x[static_cast<size_t>(i)] * seconds;
  }
  ++steps_seen_;
}

// Ridge-regularised normal equations (a small ridge on the slopes keeps a term that has
// not varied at zero instead of undefined), by Gaussian elimination with pivoting.
bool DraftController::solve(std::array<double, kTerms>* theta) const {
  if (steps_seen_ < kMinSteps) return false;
  std::array<std::array<double, kTerms + 1>, kTerms> m{};
  const double scale = std::max(1e-12, xtx_[0][0]);
  for (int i = 0; i < kTerms; ++i) {
    for (int j = 0; j < kTerms; ++j) m[static_cast<size_t>(i)][static_cast<size_t>(j)] = xtx_[static_cast<size_t>(i)][static_cast<size_t>(j)];
    if (i > 0) m[static_cast<size_t>(i)][static_cast<size_t>(i)] += 1e-6 * scale;
    m[static_cast<size_t>(i)][kTerms] = xty_[static_cast<size_t>(i)];
  }
  for (int c = 0; c < kTerms; ++c) {
    int piv = c;
    for (int r = c + 1; r < kTerms; ++r) {
      if (std::abs(m[static_cast<size_t>(r)][static_cast<size_t>(c)]) > std::abs(m[static_cast<size_t>(piv)][static_cast<size_t>(c)])) piv = r;
    }
    if (std::abs(m[static_cast<size_t>(piv)][static_cast<size_t>(c)]) < 1e-18) return false;
    std::swap(m[static_cast<size_t>(c)], m[static_cast<size_t>(piv)]);
    for (int r = 0; r < kTerms; ++r) {
      if (r == c) continue;
      const double f = m[static_cast<size_t>(r)][static_cast<size_t>(c)] / m[static_cast<size_t>(c)][static_cast<size_t>(c)];
      for (int j = c; j <= kTerms; ++j) m[static_cast<size_t>(r)][static_cast<size_t>(j)] -= f * m[static_cast<size_t>(c)][static_cast<size_t>(j)];
    }
  }
  for (int i = 0; i < kTerms; ++i) {
    (*theta)[static_cast<size_t>(i)] = m[static_cast<size_t>(i)][kTerms] / m[static_cast<size_t>(i)][static_cast<size_t>(i)];
  }
  return true;
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
  // Seconds of the step without drafts and of one draft row, in any consistent unit.
  double step, row;
  std::array<double, kTerms> t{};
  if (solve(&t) && t[0] > 0.0) {
    step = t[0] + std::max(0.0, t[1]) * shape.decode_seqs + std::max(0.0, t[2]) * shape.prefill_tokens;
    // Never free: a fit that finds draft rows cheaper than 1% of the fixed part is noise.
    row = std::max(t[3], 0.01 * t[0]);
  } else {
    step = 1.0;
    row = kColdRowFraction;
  }
  items_.clear();
  for (size_t i = 0; i < candidates.size(); ++i) {
    const double a = acceptance(candidates[i].seq_id, candidates[i].source);
    double v = 1.0;
    for (int j = 1; j <= candidates[i].proposed; ++j) {
      v *= a;
      items_.push_back(Item{v, i, j});
    }
  }
  // Highest expected tokens first; a sequence's tokens in order (a^j falls with j).
  std::sort(items_.begin(), items_.end(), [](const Item& x, const Item& y) {
    return x.value != y.value ? x.value > y.value : x.j < y.j;
  });
  double tokens = std::max(1, shape.decode_seqs);
  int room = shape.draft_room;
  for (const Item& it : items_) {
    if (room <= 0 || it.value * step < tokens * row) break;
    DraftCandidate& c = candidates[it.candidate];
    if (it.j != c.k + 1) continue;  // only after the draft's earlier tokens
    c.k = it.j;
    tokens += it.value;
    step += row;
    --room;
  }
}

}  // namespace metro::engine::speculative
