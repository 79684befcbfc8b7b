// Online least squares with forgetting: y ~ theta . x over the observations seen, the older
// ones weighted down by `forget` per observation. The speculation controller fits the
// step's time on its shape with it, and a draft model's proposer the time of its passes.
#pragma once

#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <utility>

namespace metro::engine::speculative {

template <int N>
class OnlineFit {
 public:
  explicit OnlineFit(double forget) : forget_(forget) {}

  void add(const std::array<double, N>& x, double y) {
    for (size_t i = 0; i < N; ++i) {
      for (size_t j = 0; j < N; ++j) xtx_[i][j] = xtx_[i][j] * forget_ + x[i] * x[j];
      xty_[i] = xty_[i] * forget_ + x[i] * y;
    }
    ++seen_;
  }
  int64_t seen() const { return seen_; }

  // Ridge-regularised normal equations (a small ridge on the slopes, terms 1..N-1, keeps a
  // term that has not varied at zero instead of undefined), by Gaussian elimination with
  // pivoting. False when the system is singular.
  bool solve(std::array<double, N>* theta) const {
    std::array<std::array<double, N + 1>, N> m{};
    const double scale = xtx_[0][0] > 1e-12 ? xtx_[0][0] : 1e-12;
    for (size_t i = 0; i < N; ++i) {
      for (size_t j = 0; j < N; ++j) m[i][j] = xtx_[i][j];
      if (i > 0) m[i][i] += 1e-6 * scale;
      m[i][N] = xty_[i];
    }
    for (size_t c = 0; c < N; ++c) {
      size_t piv = c;
      for (size_t r = c + 1; r < N; ++r) {
        if (std::abs(m[r][c]) > std::abs(m[piv][c])) piv = r;
      }
      if (std::abs(m[piv][c]) < 1e-18) return false;
      std::swap(m[c], m[piv]);
      for (size_t r = 0; r < N; ++r) {
        if (r == c) continue;
        const double f = m[r][c] / m[c][c];
        for (size_t j = c; j <= N; ++j) m[r][j] -= f * m[c][j];
      }
    }
    for (size_t i = 0; i < N; ++i) (*theta)[i] = m[i][N] / m[i][i];
    return true;
  }

 private:
  double forget_;
  std::array<std::array<double, N>, N> xtx_{};
  std::array<double, N> xty_{};
  int64_t seen_ = 0;
};

}  // namespace metro::engine::speculative
