#include "sched/length_predictor.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <numeric>

#include "base/check.h"
#include "base/hash.h"

namespace metro::sched {

namespace {

int log2_bucket(int n) { return n <= 1 ? 0 : std::bit_width(static_cast<unsigned>(n)) - 1; }

// Linear-interpolated quantile; reorders v (selection, not a full sort).
double quantile(std::vector<double>& v, double q) {
  if (v.empty()) return 0.0;
  const double pos = q * static_cast<double>(v.size() - 1);
  const size_t lo = static_cast<size_t>(pos);
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(lo), v.end());
  const double a = v[lo];
  if (lo + 1 >= v.size()) return a;
  const double b = *std::min_element(v.begin() + static_cast<std::ptrdiff_t>(lo) + 1, v.end());
  return a + (b - a) * (pos - static_cast<double>(lo));
}

std::vector<double> ranks(std::span<const double> x) {
  std::vector<size_t> idx(x.size());
  std::iota(idx.begin(), idx.end(), size_t{0});
  std::sort(idx.begin(), idx.end(), [&](size_t a, size_t b) { return x[a] < x[b]; });
  std::vector<double> r(x.size());
  for (size_t i = 0; i < idx.size();) {
    size_t j = i;
    while (j + 1 < idx.size() && x[idx[j + 1]] == x[idx[i]]) ++j;
    const double avg = 0.5 * static_cast<double>(i + j) + 1.0;
    for (size_t k = i; k <= j; ++k) r[idx[k]] = avg;
    i = j + 1;
  }
  return r;
}

}  // namespace

LengthFeatures LengthFeatures::of(const SeqState& s) {
  return {.n_prompt = s.n_prompt,
          .max_new_tokens = s.max_new_tokens,
          .sla_class = s.sla_class,
          .tenant_hash = s.tenant.empty() ? 0 : hash_string(s.tenant),
          .prefix_hash = s.prefix_hash};
}

BucketQuantilePredictor::BucketQuantilePredictor(const BucketPredictorConfig& cfg) : cfg_(cfg) {
  METRO_CHECK(cfg_.window >= 1 && cfg_.min_samples >= 1 && cfg_.max_buckets >= 0);
}

uint64_t BucketQuantilePredictor::bucket_key(const LengthFeatures& f, int level) {
  const uint64_t mb = static_cast<uint64_t>(log2_bucket(f.max_new_tokens));
  const uint64_t pb = static_cast<uint64_t>(log2_bucket(f.n_prompt));
  const uint64_t cls = static_cast<uint64_t>(f.sla_class);
  uint64_t h = mix64(static_cast<uint64_t>(level) + 1);
  switch (level) {
    case 0: return hash_combine(hash_combine(h, f.prefix_hash), mb);
    case 1: return hash_combine(hash_combine(hash_combine(hash_combine(h, f.tenant_hash), cls), pb), mb);
    case 2: return hash_combine(hash_combine(hash_combine(h, cls), pb), mb);
    case 3: return hash_combine(h, mb);
    default: return h;
  }
}

void BucketQuantilePredictor::observe(const LengthFeatures& f, int n_output_tokens) {
  if (n_output_tokens < 0) return;
  for (int level = 0; level < kLevels; ++level) {
    if (level == 0 && f.prefix_hash == 0) continue;
    const uint64_t key = bucket_key(f, level);
    auto it = buckets_.find(key);
    if (it == buckets_.end()) {
      // Template and tenant buckets are as many as clients make them; the coarse levels are
      // bounded by the bucket arithmetic. Past the cap, new fine buckets are not created.
      const bool fine = level <= 1;
      if (fine && static_cast<int>(buckets_.size()) >= cfg_.max_buckets) continue;
      it = buckets_.emplace(key, Bucket{}).first;
      it->second.lengths.reserve(static_cast<size_t>(std::min(cfg_.window, 16)));
    }
    Bucket& b = it->second;
    if (static_cast<int>(b.lengths.size()) < cfg_.window) {
      b.lengths.push_back(n_output_tokens);
    } else {
      b.lengths[b.next] = n_output_tokens;
      b.next = (b.next + 1) % b.lengths.size();
    }
  }
  ++n_observed_;
}

LengthPrediction BucketQuantilePredictor::predict(const LengthFeatures& f, int n_generated) const {
  LengthPrediction p;
  const int g = std::max(0, n_generated);
  const double cap = std::max(0, f.max_new_tokens - g);
  if (cap <= 0.0) return p;
  auto clamp = [&](double v) { return std::clamp(v, 1.0, cap); };

  std::vector<double> rest;
  for (int level = 0; level < kLevels; ++level) {
    if (level == 0 && f.prefix_hash == 0) continue;
    auto it = buckets_.find(bucket_key(f, level));
    if (it == buckets_.end()) continue;
    rest.clear();
    for (int32_t len : it->second.lengths) {
      if (len > g) rest.push_back(static_cast<double>(len - g));
    }
    if (static_cast<int>(rest.size()) < cfg_.min_samples) continue;
    const double mean = std::accumulate(rest.begin(), rest.end(), 0.0) / static_cast<double>(rest.size());
    p.mean_remaining = clamp(mean);
    p.median_remaining = clamp(quantile(rest, 0.5));
    p.p90_remaining = clamp(quantile(rest, 0.9));
    p.n_samples = static_cast<int>(rest.size());
    return p;
  }
  // No history: half of what may still be generated, the middle of a uniform prior, and
  // the cap as the pessimistic tail.
  p.mean_remaining = clamp(cap / 2.0);
  p.median_remaining = p.mean_remaining;
  p.p90_remaining = clamp(cap * 0.9);
  return p;
}

double spearman_rank_correlation(std::span<const double> x, std::span<const double> y) {
  METRO_CHECK(x.size() == y.size());
  const size_t n = x.size();
  if (n < 2) return 0.0;
  const std::vector<double> rx = ranks(x), ry = ranks(y);
  // Pearson correlation of the ranks (exact with ties, unlike the 1 - 6 sum d^2 shortcut).
  const double mean = 0.5 * static_cast<double>(n + 1);
  double sxy = 0.0, sxx = 0.0, syy = 0.0;
  for (size_t i = 0; i < n; ++i) {
    const double dx = rx[i] - mean, dy = ry[i] - mean;
    sxy += dx * dy;
    sxx += dx * dx;
    syy += dy * dy;
  }
  if (sxx <= 0.0 || syy <= 0.0) return 0.0;
  return sxy / std::sqrt(sxx * syy);
}

PredictionAccuracy::PredictionAccuracy(int window) : window_(static_cast<size_t>(std::max(1, window))) {}

void PredictionAccuracy::add(double predicted, double actual) {
  if (!std::isfinite(predicted) || !std::isfinite(actual)) return;
  if (predicted_.size() < window_) {
    predicted_.push_back(predicted);
    actual_.push_back(actual);
    return;
  }
  predicted_[next_] = predicted;
  actual_[next_] = actual;
  next_ = (next_ + 1) % window_;
}

PredictionAccuracy::Snapshot PredictionAccuracy::snapshot() const {
  Snapshot s;
  s.n = static_cast<int>(predicted_.size());
  if (s.n == 0) return s;
  int close = 0;
  double abs_err = 0.0;
  for (size_t i = 0; i < predicted_.size(); ++i) {
    const double e = std::fabs(predicted_[i] - actual_[i]);
    close += e <= 100.0 ? 1 : 0;
    abs_err += e;
  }
  s.within_100 = static_cast<double>(close) / s.n;
  s.mean_abs_error = abs_err / s.n;
  s.spearman = spearman_rank_correlation(predicted_, actual_);
  return s;
}

}  // namespace metro::sched
