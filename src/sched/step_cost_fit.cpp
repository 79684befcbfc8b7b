#include "sched/step_cost_fit.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <utility>

namespace metro::sched {

int StepCostModel::max_prefill(double seconds, int64_t pos, int cap) const {
  if (cap <= 0 || !(seconds > 0.0) || per_prefill_token_s <= 0.0) return 0;
  const double a = per_prefill_token_s, b = per_attention_pair_s;
  // prefill_s(n) = (b / 2) n^2 + (a + b (pos + 1/2)) n, increasing in n.
  const double lin = a + b * (static_cast<double>(pos) + 0.5);
  double n = b > 0.0 ? (std::sqrt(lin * lin + 2.0 * b * seconds) - lin) / b : seconds / a;
  n = std::min(n, static_cast<double>(cap));
  int k = static_cast<int>(std::floor(n));
  while (k > 0 && prefill_s(k, pos) > seconds) --k;  // rounding of the root
  return k;
}


void StepCostFit::observe(double step_s, int prefill_tokens, int decode_seqs, double prefill_pairs,
                          double decode_ctx) {
  const double x[kN] = {1.0, static_cast<double>(prefill_tokens + decode_seqs), prefill_pairs, decode_ctx};
  for (int i = 0; i < kN; ++i) {
    for (int j = 0; j < kN; ++j) xtx_[i][j] = forget_ * xtx_[i][j] + x[i] * x[j];
    xty_[i] = forget_ * xty_[i] + x[i] * step_s;
  }
  ++steps_;
}

namespace {

// Solves the normal equations restricted to the features in `on` (Gauss-Jordan with partial
// pivoting); false when singular.
bool solve(const double (&xtx)[4][4], const double (&xty)[4], const std::array<bool, 4>& on,
           std::array<double, 4>* coef) {
  int idx[4];
  int n = 0;
  for (int i = 0; i < 4; ++i) {
    if (on[static_cast<size_t>(i)]) idx[n++] = i;
  }
  double a[4][5];
  for (int r = 0; r < n; ++r) {
    for (int c = 0; c < n; ++c) {
      // Ridge relative to the feature's own scale: stabilises a feature that barely varies
      // without biasing one that does.
      a[r][c] = xtx[idx[r]][idx[c]] + (r == c ? 1e-6 * xtx[idx[r]][idx[r]] + 1e-12 : 0.0);
    }
    a[r][n] = xty[idx[r]];
  }
  for (int col = 0; col < n; ++col) {
    int piv = col;
    for (int r = col + 1; r < n; ++r) {
      if (std::fabs(a[r][col]) > std::fabs(a[piv][col])) piv = r;
    }
    if (std::fabs(a[piv][col]) < 1e-300) return false;
    for (int k = 0; k <= n; ++k) std::swap(a[col][k], a[piv][k]);
    for (int r = 0; r < n; ++r) {
      if (r == col) continue;
      const double f = a[r][col] / a[col][col];
      for (int k = col; k <= n; ++k) a[r][k] -= f * a[col][k];
    }
  }
  coef->fill(0.0);
  for (int r = 0; r < n; ++r) (*coef)[static_cast<size_t>(idx[r])] = a[r][n] / a[r][r];
  return true;
}

}  // namespace

std::optional<StepCostModel> StepCostFit::fit() const {
  if (steps_ == 0) return std::nullopt;
  if (steps_ < kMinStepsForTerms) {
    // Too few steps to tell the terms apart (a server's first steps: the calibration
    // prefill and the first requests). Every second goes to the per-token term, fixed and
    // attention costs included, so these steps are planned on the safe side, but timed:
    // untimed, the first requests after start would run max_batch_tokens steps long enough
    // to break their TPOT objective.
    if (xtx_[1][1] <= 0.0 || xty_[1] <= 0.0) return std::nullopt;
    StepCostModel m;
    m.per_prefill_token_s = xty_[1] / xtx_[1][1];
    m.per_decode_seq_s = m.per_prefill_token_s;
    return m;
  }
  std::array<bool, 4> on = {true, true, xtx_[2][2] > 0.0, xtx_[3][3] > 0.0};
  std::array<double, 4> c{};
  // Drop the most negative term and refit until every coefficient is >= 0 (at most 4 rounds).
  for (int round = 0; round < 4; ++round) {
    if (!solve(xtx_, xty_, on, &c)) return std::nullopt;
    int worst = -1;
    for (int i = 0; i < 4; ++i) {
      if (on[static_cast<size_t>(i)] && c[static_cast<size_t>(i)] < 0.0 &&
          (worst < 0 || c[static_cast<size_t>(i)] < c[static_cast<size_t>(worst)])) {
        worst = i;
      }
    }
    if (worst < 0) break;
    if (worst == 1) return std::nullopt;  // no positive per-token cost: nothing to plan with
    on[static_cast<size_t>(worst)] = false;
  }
  for (double v : c) {
    if (v < 0.0 || !std::isfinite(v)) return std::nullopt;
  }
  if (c[1] <= 0.0) return std::nullopt;
  StepCostModel m;
  m.fixed_s = c[0];
  m.per_prefill_token_s = c[1];
  m.per_decode_seq_s = c[1];
  m.per_attention_pair_s = c[2];
  m.per_decode_ctx_s = c[3];
  return m;
}

bool StepCostTracker::observe(const StepCostSample& s) {
  fit_.observe(s.step_s, s.prefill_tokens, s.decode_seqs, s.prefill_pairs, s.decode_ctx);
  if (fit_.steps() > StepCostFit::kMinStepsForTerms && fit_.steps() % kRefitEvery != 0) return false;
  const std::optional<StepCostModel> m = fit_.fit();
  if (!m) return false;
  model_ = *m;
  return true;
}

}  // namespace metro::sched
