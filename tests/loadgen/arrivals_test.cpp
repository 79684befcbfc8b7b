#include "loadgen/arrivals.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "loadgen/rng.h"

namespace metro::loadgen {
namespace {

struct GapStats {
  double mean = 0, cv = 0;
};

GapStats gap_stats(const std::vector<double>& t) {
  std::vector<double> gaps;
  for (size_t i = 1; i < t.size(); ++i) gaps.push_back(t[i] - t[i - 1]);
  double sum = 0;
  for (double g : gaps) sum += g;
  const double mean = sum / static_cast<double>(gaps.size());
  double var = 0;
  for (double g : gaps) var += (g - mean) * (g - mean);
  var /= static_cast<double>(gaps.size() - 1);
  return {mean, std::sqrt(var) / mean};
}

// 20000 gaps. The tolerances are about five standard errors: for the mean, sigma/sqrt(n) =
// CV/sqrt(n) relative (0.7% for CV 1, 1.4% for CV 2); for the CV, the sample variance's
// relative error is sqrt((2 + 6/B) / n) (gamma's excess kurtosis is 6/B), halved for the
// square root: 0.7% for B = 4, 1.0% for B = 1, 1.8% for B = 0.25.
TEST(LoadgenArrivals, MeanRateAndBurstinessWithinStatisticalBounds) {
  const size_t n = 20001;
  struct Case {
    double rate, burstiness, mean_tol, cv_tol;
  };
  for (const Case& c : {Case{5.0, 1.0, 0.035, 0.05}, Case{20.0, 0.25, 0.07, 0.09},
                        Case{2.0, 4.0, 0.02, 0.035}}) {
    ArrivalProcess p{c.rate, c.burstiness};
    auto t = arrival_offsets(p, n, 42);
    ASSERT_EQ(t.size(), n);
    EXPECT_EQ(t[0], 0.0);
    for (size_t i = 1; i < n; ++i) ASSERT_GE(t[i], t[i - 1]);
    GapStats s = gap_stats(t);
    const double want_cv = 1.0 / std::sqrt(c.burstiness);
    EXPECT_NEAR(s.mean * c.rate, 1.0, c.mean_tol) << "rate " << c.rate << " B " << c.burstiness;
    EXPECT_NEAR(s.cv / want_cv, 1.0, c.cv_tol) << "rate " << c.rate << " B " << c.burstiness;
  }
}

TEST(LoadgenArrivals, DeterministicGivenSeed) {
  ArrivalProcess p{3.0, 0.5};
  EXPECT_EQ(arrival_offsets(p, 100, 7), arrival_offsets(p, 100, 7));
  EXPECT_NE(arrival_offsets(p, 100, 7), arrival_offsets(p, 100, 8));
  // A prefix of a longer schedule is the shorter schedule.
  auto long_run = arrival_offsets(p, 200, 7);
  long_run.resize(100);
  EXPECT_EQ(long_run, arrival_offsets(p, 100, 7));
}

TEST(LoadgenArrivals, InfiniteRateIsAllAtOnce) {
  ArrivalProcess p;
  EXPECT_TRUE(p.all_at_once());
  EXPECT_EQ(arrival_offsets(p, 5, 1), std::vector<double>(5, 0.0));
}

TEST(LoadgenArrivals, Validation) {
  EXPECT_FALSE((ArrivalProcess{0.0, 1.0}).validate().ok());
  EXPECT_FALSE((ArrivalProcess{-1.0, 1.0}).validate().ok());
  EXPECT_FALSE((ArrivalProcess{1.0, 0.0}).validate().ok());
  EXPECT_FALSE((ArrivalProcess{1.0, std::numeric_limits<double>::quiet_NaN()}).validate().ok());
  EXPECT_TRUE((ArrivalProcess{1.0, 0.1}).validate().ok());
}

TEST(LoadgenRng, GammaAndNormalMoments) {
  Rng rng(123);
  const int n = 200000;
  double s = 0, s2 = 0;
  for (int i = 0; i < n; ++i) {
    const double x = rng.normal();
    s += x;
    s2 += x * x;
  }
  EXPECT_NEAR(s / n, 0.0, 0.015);      // 5 standard errors of 1/sqrt(n) = 0.0022
  EXPECT_NEAR(s2 / n, 1.0, 0.02);
  for (double k : {0.3, 1.0, 3.0}) {
    double g = 0, g2 = 0;
    for (int i = 0; i < n; ++i) {
      const double x = rng.gamma(k, 2.0);
      ASSERT_GT(x, 0.0);
      g += x;
      g2 += x * x;
    }
    const double mean = g / n, var = g2 / n - mean * mean;
    EXPECT_NEAR(mean / (2.0 * k), 1.0, 0.03) << k;     // mean k * theta
    EXPECT_NEAR(var / (4.0 * k), 1.0, 0.06) << k;      // variance k * theta^2
  }
}

TEST(LoadgenRng, StreamsAreIndependentAndStable) {
  Rng a = Rng::stream(5, "arrivals"), b = Rng::stream(5, "lengths"), c = Rng::stream(5, "arrivals");
  const uint64_t x = a.next();
  EXPECT_NE(x, b.next());
  EXPECT_EQ(x, c.next());
  for (int i = 0; i < 1000; ++i) {
    const double u = a.uniform01();
    ASSERT_GT(u, 0.0);
    ASSERT_LT(u, 1.0);
  }
}

}  // namespace
}  // namespace metro::loadgen
