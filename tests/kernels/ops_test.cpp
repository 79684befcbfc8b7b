// Elementwise ops against their double-precision references, with tolerances derived from
// each kernel's float evaluation order (see the error budgets in ops_avx2.cpp), and RoPE
// against the closed-form rotation.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numbers>
#include <random>
#include <vector>

#include "kernels/ops.h"
#include "kernels/ops_table.h"

namespace metro::kernels {
namespace {

constexpr double kU = 0x1p-24;  // unit roundoff of float

const std::vector<int64_t>& test_sizes() {
  static const std::vector<int64_t> sizes = [] {
    std::vector<int64_t> s;
    for (int64_t n = 1; n <= 67; ++n) s.push_back(n);
    s.insert(s.end(), {576, 1536, 4097});
    return s;
  }();
  return sizes;
}

std::vector<float> random_vec(int64_t n, float lo, float hi, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = dist(rng);
  return v;
}

bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof(float)) == 0; }

TEST(Ops, IsaIsReported) {
  const auto isa = ops_isa();
  EXPECT_TRUE(isa == "avx2" || isa == "scalar") << isa;
}

TEST(Ops, AddMulScaleAreBitExact) {
  for (int64_t n : test_sizes()) {
    SCOPED_TRACE(n);
    const auto a = random_vec(n, -3, 3, 1);
    const auto b = random_vec(n, -3, 3, 2);
    std::vector<float> got(a.size()), want(a.size());
    add(a.data(), b.data(), got.data(), n);
    ref::add(a.data(), b.data(), want.data(), n);
    for (int64_t i = 0; i < n; ++i) ASSERT_TRUE(same_bits(got[i], want[i])) << "add " << i;
    mul(a.data(), b.data(), got.data(), n);
    ref::mul(a.data(), b.data(), want.data(), n);
    for (int64_t i = 0; i < n; ++i) ASSERT_TRUE(same_bits(got[i], want[i])) << "mul " << i;
    got = a;
    want = a;
    scale(got.data(), 0.37f, n);
    ref::scale(want.data(), 0.37f, n);
    for (int64_t i = 0; i < n; ++i) ASSERT_TRUE(same_bits(got[i], want[i])) << "scale " << i;
  }
}

TEST(Ops, AddWritesOnlyItsRangeAndMayAlias) {
  std::vector<float> a(20, 1.0f), b(20, 2.0f);
  const float sentinel = -7.0f;
  a[13] = sentinel;
  add(a.data(), b.data(), a.data(), 13);  // out aliases a; a[13] must survive
  for (int i = 0; i < 13; ++i) EXPECT_EQ(a[i], 3.0f);
  EXPECT_EQ(a[13], sentinel);
}

// With small integers every product and partial sum is exact, so any order gives the exact
// dot product: a dropped or doubled tail element cannot hide inside a tolerance.
TEST(Ops, DotIsExactOnSmallIntegers) {
  std::mt19937 rng(3);
  std::uniform_int_distribution<int> dist(-3, 3);
  for (int64_t n : test_sizes()) {
    std::vector<float> a(static_cast<size_t>(n)), b(static_cast<size_t>(n));
    int64_t exact = 0;
    for (int64_t i = 0; i < n; ++i) {
      a[i] = static_cast<float>(dist(rng));
      b[i] = static_cast<float>(dist(rng));
      exact += static_cast<int64_t>(a[i]) * static_cast<int64_t>(b[i]);
    }
    EXPECT_EQ(dot_f32(a.data(), b.data(), n), static_cast<float>(exact)) << n;
  }
}

// Bound: each of the 32 partial sums adds about n/32 products, then 5 reduction levels:
// |error| <= (n/32 + 8) u sum|a_i b_i|, plus the reference's own final rounding.
TEST(Ops, DotMatchesReference) {
  for (int64_t n : test_sizes()) {
    const auto a = random_vec(n, -1, 1, 4);
    const auto b = random_vec(n, -1, 1, 5);
    double abs_sum = 0;
    for (int64_t i = 0; i < n; ++i) abs_sum += std::fabs(static_cast<double>(a[i]) * b[i]);
    const double want = ref::dot_f32(a.data(), b.data(), n);
    const double tol = (static_cast<double>(n) / 32 + 8) * kU * abs_sum + kU * std::fabs(want);
    EXPECT_NEAR(dot_f32(a.data(), b.data(), n), want, tol) << n;
  }
}

// Bound: the mean square carries the dot bound (n/32 + 8) u relative (all terms positive);
// 1/sqrt halves it and adds 2 roundings, then 2 multiplies: relative 0.5(n/32 + 8) u + 6 u.
TEST(Ops, RmsNormMatchesReference) {
  for (int64_t n : test_sizes()) {
    SCOPED_TRACE(n);
    const auto x = random_vec(n, -4, 4, 6);
    const auto w = random_vec(n, 0.5f, 2, 7);
    std::vector<float> got(x.size()), want(x.size());
    rms_norm(x.data(), w.data(), got.data(), n, 1e-5f);
    ref::rms_norm(x.data(), w.data(), want.data(), n, 1e-5f);
    const double rel = 0.5 * (static_cast<double>(n) / 32 + 8) * kU + 6 * kU;
    for (int64_t i = 0; i < n; ++i) ASSERT_NEAR(got[i], want[i], rel * std::fabs(want[i])) << i;
    std::vector<float> inplace = x;  // y may alias x
    rms_norm(inplace.data(), w.data(), inplace.data(), n, 1e-5f);
    for (int64_t i = 0; i < n; ++i) ASSERT_TRUE(same_bits(inplace[i], got[i])) << i;
  }
}

TEST(Ops, RmsNormOfZerosIsZero) {
  std::vector<float> x(40, 0.0f), w(40, 1.0f), y(40, 1.0f);
  rms_norm(x.data(), w.data(), y.data(), 40, 1e-6f);
  for (float v : y) EXPECT_EQ(v, 0.0f);
}

// silu(x) = x / (1 + e^-x): one exp and 2 roundings. swiglu adds one multiply.
TEST(Ops, SiluAndSwigluMatchReference) {
  for (int64_t n : test_sizes()) {
    SCOPED_TRACE(n);
    const auto g = random_vec(n, -20, 20, 8);
    const auto up = random_vec(n, -3, 3, 9);
    std::vector<float> got(g.size()), want(g.size());
    silu(g.data(), got.data(), n);
    ref::silu(g.data(), want.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_NEAR(got[i], want[i], (kExpMaxRelError + 3 * kU) * std::fabs(want[i])) << i;
    }
    swiglu(g.data(), up.data(), got.data(), n);
    ref::swiglu(g.data(), up.data(), want.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_NEAR(got[i], want[i], (kExpMaxRelError + 4 * kU) * std::fabs(want[i])) << i;
    }
    std::vector<float> alias = g;  // out may alias gate
    swiglu(alias.data(), up.data(), alias.data(), n);
    for (int64_t i = 0; i < n; ++i) ASSERT_TRUE(same_bits(alias[i], got[i])) << i;
  }
}

TEST(Ops, SiluSaturatesWithoutNaN) {
  const std::vector<float> x = {-1000.0f, -100.0f, -88.0f, 0.0f, 88.0f, 100.0f, 1000.0f};
  std::vector<float> y(x.size());
  silu(x.data(), y.data(), static_cast<int64_t>(x.size()));
  for (size_t i = 0; i < x.size(); ++i) {
    ASSERT_FALSE(std::isnan(y[i])) << x[i];
    if (x[i] <= -100.0f) {
      EXPECT_LE(std::fabs(y[i]), 1e-30f) << x[i];
    }
    if (x[i] >= 88.0f) {
      EXPECT_EQ(y[i], x[i]) << x[i];
    }
  }
}

// gelu = x / (1 + e^(-2z)), z = sqrt(2/pi)(x + 0.044715 x^3): 2z carries about 4u relative
// error (constants, x^2, one FMA, one multiply), which e^(-2z) turns into 8u|z| relative.
TEST(Ops, GeluMatchesReference) {
  const double k = std::sqrt(2.0 / std::numbers::pi);
  for (int64_t n : test_sizes()) {
    SCOPED_TRACE(n);
    const auto x = random_vec(n, -10, 10, 10);
    std::vector<float> got(x.size()), want(x.size());
    gelu(x.data(), got.data(), n);
    ref::gelu(x.data(), want.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      const double v = x[i];
      const double z = std::fabs(k * (v + 0.044715 * v * v * v));
      const double tol = (kExpMaxRelError + 8 * kU * z + 3 * kU) * std::fabs(want[i]);
      ASSERT_NEAR(got[i], want[i], tol) << "x=" << x[i];
    }
  }
}

// cap tanh(x / cap) = cap (1 - 2 / (e^(2|x|/cap) + 1)): exp's relative error on e becomes at
// most about its own size in tanh's absolute error (2e / (e + 1)^2 <= 1/2), plus a few
// roundings of values at most 1; times cap. Saturates to exactly +-cap, keeps the sign, and
// leaves x alone for cap <= 0.
TEST(Ops, SoftcapMatchesReference) {
  for (float cap : {50.0f, 30.0f, 1.0f}) {
    for (int64_t n : test_sizes()) {
      SCOPED_TRACE(n);
      auto x = random_vec(n, -4 * cap, 4 * cap, 12);
      if (n > 2) {
        x[0] = 1e30f;
        x[1] = -1e30f;
        x[2] = 0.0f;
      }
      std::vector<float> got = x, want = x;
      softcap(got.data(), n, cap);
      ref::softcap(want.data(), n, cap);
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_NEAR(got[i], want[i], (kExpMaxRelError + 6 * kU) * cap) << "x=" << x[i] << " cap=" << cap;
        ASSERT_LE(std::fabs(got[i]), cap);
        ASSERT_EQ(std::signbit(got[i]), std::signbit(x[i])) << x[i];
      }
      if (n > 2) {
        EXPECT_EQ(got[0], cap);
        EXPECT_EQ(got[1], -cap);
        EXPECT_EQ(got[2], 0.0f);
      }
    }
  }
  std::vector<float> x = {1.0f, -200.0f};
  softcap(x.data(), 2, 0.0f);
  EXPECT_EQ(x, (std::vector<float>{1.0f, -200.0f}));
}

// Per element: exp error, the rounded subtraction x - max (u |x - max| after exp), a sum of
// n/8 terms per lane plus 3 levels (n/8 + 4) u, the reciprocal and the multiply.
TEST(Ops, SoftmaxMatchesReference) {
  for (int64_t n : test_sizes()) {
    SCOPED_TRACE(n);
    const auto x = random_vec(n, -30, 30, 11);
    std::vector<float> got = x, want = x;
    softmax(got.data(), n);
    ref::softmax(want.data(), n);
    const float mx = *std::max_element(x.begin(), x.end());
    double sum = 0;
    for (int64_t i = 0; i < n; ++i) {
      const double tol = (kExpMaxRelError + kU * std::fabs(x[i] - mx) +
                          (static_cast<double>(n) / 8 + 8) * kU) * want[i];
      ASSERT_NEAR(got[i], want[i], tol) << i;
      sum += got[i];
    }
    EXPECT_NEAR(sum, 1.0, (static_cast<double>(n) / 8 + 16) * kU);
  }
}

TEST(Ops, SoftmaxIgnoresMinusInfinity) {
  std::vector<float> x = {1.0f, -std::numeric_limits<float>::infinity(), 1.0f,
                          -std::numeric_limits<float>::infinity(), 1.0f, 1.0f, 1.0f, 1.0f,
                          1.0f, 1.0f};
  softmax(x.data(), static_cast<int64_t>(x.size()));
  EXPECT_EQ(x[1], 0.0f);
  EXPECT_EQ(x[3], 0.0f);
  EXPECT_NEAR(x[0], 0.125f, 1e-7f);
  EXPECT_NEAR(x[9], 0.125f, 1e-7f);
}

// Both round x - max and the product by scale (2u, times |x - max| scale after exp), then exp.
TEST(Ops, SoftmaxWeightsMatchReference) {
  for (int64_t n : test_sizes()) {
    for (float scale : {1.0f, 1.0f / 0.7f, 0.25f}) {
      SCOPED_TRACE(testing::Message() << "n=" << n << " scale=" << scale);
      auto x = random_vec(n, -30, 30, 12);
      if (n > 3) x[static_cast<size_t>(n / 2)] = -std::numeric_limits<float>::infinity();
      std::vector<float> got(x.size()), want(x.size());
      const float m = softmax_weights(x.data(), got.data(), n, scale);
      const float m_ref = ref::softmax_weights(x.data(), want.data(), n, scale);
      EXPECT_EQ(m, m_ref);
      EXPECT_EQ(m, *std::max_element(x.begin(), x.end()));
      bool has_one = false;
      for (int64_t i = 0; i < n; ++i) {
        if (std::isinf(x[i])) {
          ASSERT_EQ(got[i], 0.0f);
          ASSERT_EQ(want[i], 0.0f);
          continue;
        }
        const double arg = std::fabs(static_cast<double>(x[i]) - m) * scale;
        ASSERT_NEAR(got[i], want[i], (kExpMaxRelError + 2 * kU * arg + kU) * want[i]) << i;
        has_one = has_one || got[i] == 1.0f;
      }
      EXPECT_TRUE(has_one);  // the maximum's weight
      if (n > 3) {
        EXPECT_EQ(got[static_cast<size_t>(n / 2)], 0.0f);
      }
      std::vector<float> alias = x;  // y may alias x
      softmax_weights(alias.data(), alias.data(), n, scale);
      for (int64_t i = 0; i < n; ++i) ASSERT_TRUE(same_bits(alias[i], got[i])) << i;
    }
  }
}

TEST(Ops, ArgmaxIsTheFirstLargestAndSkipsNaN) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (int64_t n : test_sizes()) {
    SCOPED_TRACE(n);
    auto x = random_vec(n, -5, 5, 13);
    EXPECT_EQ(argmax(x.data(), n), ref::argmax(x.data(), n));
    EXPECT_EQ(argmax(x.data(), n), std::max_element(x.begin(), x.end()) - x.begin());
    if (n < 3) continue;
    // Ties go to the first; NaN, even first or beside the maximum, never wins.
    const int64_t a = n / 3, b = n - 1;
    x[static_cast<size_t>(a)] = x[static_cast<size_t>(b)] = 9.0f;
    x[0] = nan;
    if (a + 1 < b) x[static_cast<size_t>(a + 1)] = nan;
    EXPECT_EQ(argmax(x.data(), n), a);
    EXPECT_EQ(ref::argmax(x.data(), n), a);
    x[static_cast<size_t>(a)] = -std::numeric_limits<float>::infinity();
    EXPECT_EQ(argmax(x.data(), n), b);
    EXPECT_EQ(ref::argmax(x.data(), n), b);
  }
  const std::vector<float> all_nan(20, nan);
  EXPECT_EQ(argmax(all_nan.data(), 20), 0);
  EXPECT_EQ(ref::argmax(all_nan.data(), 20), 0);
  const std::vector<float> all_neg_inf(20, -std::numeric_limits<float>::infinity());
  EXPECT_EQ(argmax(all_neg_inf.data(), 20), 0);
}

// The vectorized exp against exp in double, over a dense sweep of its whole finite range.
TEST(Ops, ExpStaysWithinItsDocumentedBound) {
  const int64_t n = 1 << 20;
  std::vector<float> x(static_cast<size_t>(n)), y(x.size());
  const double lo = -103.9, hi = 88.72;
  for (int64_t i = 0; i < n; ++i) x[i] = static_cast<float>(lo + (hi - lo) * i / (n - 1));
  exp_f32(x.data(), y.data(), n);
  double worst = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double want = std::exp(static_cast<double>(x[i]));
    if (want > std::numeric_limits<float>::max()) continue;
    if (want < std::numeric_limits<float>::min()) {  // subnormal result: one rounding
      ASSERT_LE(std::fabs(y[i] - want), 0x1p-149) << x[i];
      continue;
    }
    worst = std::max(worst, std::fabs(y[i] - want) / want);
  }
  RecordProperty("max_rel_error", std::to_string(worst));
  EXPECT_LE(worst, kExpMaxRelError);

  const std::vector<float> special = {-1e30f, -200.0f, 0.0f, 89.0f, 1e30f,
                                      std::numeric_limits<float>::infinity(),
                                      -std::numeric_limits<float>::infinity()};
  std::vector<float> out(special.size());
  exp_f32(special.data(), out.data(), static_cast<int64_t>(special.size()));
  EXPECT_EQ(out[0], 0.0f);
  EXPECT_EQ(out[1], 0.0f);
  EXPECT_EQ(out[2], 1.0f);
  EXPECT_TRUE(std::isinf(out[3]));
  EXPECT_TRUE(std::isinf(out[4]));
  EXPECT_TRUE(std::isinf(out[5]));
  EXPECT_EQ(out[6], 0.0f);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  float nan_out = 0;
  exp_f32(&nan, &nan_out, 1);
  EXPECT_TRUE(std::isnan(nan_out));
}

// The portable table is the reference itself, so a CPU without AVX2 runs exactly ref::.
TEST(Ops, ScalarTableIsTheReference) {
  EXPECT_EQ(detail::kOpsScalar.dot_f32, &ref::dot_f32);
  EXPECT_EQ(detail::kOpsScalar.softmax, &ref::softmax);
  EXPECT_EQ(detail::kOpsScalar.rope_rotate, &ref::rope_rotate);
}

// ---- RoPE ---------------------------------------------------------------------------

struct RopeCase {
  int head_dim;
  int n_rot;
  float base;
  float linear_scale;
  bool factors;
  RopeMode mode;
};

// The closed form in double: pair i of a head is rotated by
// theta_i = pos / linear_scale * base^(-2i/n_rot) / factor_i.
std::vector<double> rope_closed_form(const RopeCase& c, const std::vector<float>& factors,
                                     const std::vector<float>& x, int n_head, int64_t pos) {
  std::vector<double> y(x.begin(), x.end());
  const int half = c.n_rot / 2;
  for (int h = 0; h < n_head; ++h) {
    for (int i = 0; i < half; ++i) {
      double theta = static_cast<double>(pos) / c.linear_scale *
                     std::pow(static_cast<double>(c.base), -2.0 * i / c.n_rot);
      if (c.factors) theta /= factors[i];
      const int a = h * c.head_dim + (c.mode == RopeMode::kNormal ? 2 * i : i);
      const int b = h * c.head_dim + (c.mode == RopeMode::kNormal ? 2 * i + 1 : i + half);
      y[a] = x[a] * std::cos(theta) - x[b] * std::sin(theta);
      y[b] = x[a] * std::sin(theta) + x[b] * std::cos(theta);
    }
  }
  return y;
}

class RopeTest : public ::testing::TestWithParam<RopeCase> {};

// Per component: cos and sin rounded to float (u each) and the float rotation (a product
// and an FMA, or double then one rounding): |error| <= 4 u |pair|.
TEST_P(RopeTest, MatchesClosedFormAndPreservesNorms) {
  const RopeCase c = GetParam();
  const int n_head = 5;
  std::vector<float> factors = random_vec(c.n_rot / 2, 1.0f, 8.0f, 12);
  RopeConfig cfg;
  cfg.head_dim = c.head_dim;
  cfg.n_rot = c.n_rot;
  cfg.freq_base = c.base;
  cfg.linear_scale = c.linear_scale;
  cfg.freq_factors = c.factors ? factors.data() : nullptr;
  cfg.mode = c.mode;
  const Rope rope(cfg);
  const int half = c.n_rot / 2;
  for (int64_t pos : {0, 1, 7, 100, 4095, 32768, 500000}) {
    SCOPED_TRACE(pos);
    const auto x = random_vec(int64_t{n_head} * c.head_dim, -2, 2, static_cast<uint32_t>(pos + 13));
    const auto want = rope_closed_form(c, factors, x, n_head, pos);

    std::vector<float> cos_t(static_cast<size_t>(half)), sin_t(static_cast<size_t>(half));
    rope.angles(pos, cos_t.data(), sin_t.data());
    std::vector<float> two_step = x;
    rope.apply(two_step.data(), n_head, cos_t.data(), sin_t.data());
    std::vector<float> via_ref = x;
    ref::rope_rotate(via_ref.data(), n_head, c.head_dim, c.n_rot, c.mode, cos_t.data(),
                     sin_t.data());
    std::vector<float> got = x;
    rope.apply(got.data(), n_head, pos);

    for (int h = 0; h < n_head; ++h) {
      const int base = h * c.head_dim;
      double norm_in = 0, norm_out = 0;
      for (int i = 0; i < half; ++i) {
        const int a = base + (c.mode == RopeMode::kNormal ? 2 * i : i);
        const int b = base + (c.mode == RopeMode::kNormal ? 2 * i + 1 : i + half);
        const double pair = std::hypot(x[a], x[b]);
        for (int idx : {a, b}) {
          ASSERT_NEAR(got[idx], want[idx], 4 * kU * pair) << "head " << h << " dim " << idx - base;
          ASSERT_NEAR(via_ref[idx], want[idx], 4 * kU * pair) << "ref, dim " << idx - base;
          ASSERT_TRUE(same_bits(got[idx], two_step[idx]));
        }
        norm_in += pair * pair;
        norm_out += static_cast<double>(got[a]) * got[a] + static_cast<double>(got[b]) * got[b];
      }
      EXPECT_NEAR(std::sqrt(norm_out), std::sqrt(norm_in), 6 * kU * std::sqrt(norm_in));
      for (int d = c.n_rot; d < c.head_dim; ++d) {  // dims past n_rot pass through untouched
        ASSERT_TRUE(same_bits(got[base + d], x[base + d])) << d;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Rope, RopeTest,
    ::testing::Values(RopeCase{64, 64, 10000.0f, 1.0f, false, RopeMode::kNormal},
                      RopeCase{64, 64, 10000.0f, 1.0f, false, RopeMode::kNeox},
                      RopeCase{128, 128, 500000.0f, 1.0f, true, RopeMode::kNormal},
                      RopeCase{128, 128, 500000.0f, 1.0f, true, RopeMode::kNeox},
                      RopeCase{64, 64, 10000.0f, 4.0f, false, RopeMode::kNeox},
                      RopeCase{80, 32, 10000.0f, 2.0f, true, RopeMode::kNeox},
                      RopeCase{96, 40, 10000.0f, 1.0f, false, RopeMode::kNormal},
                      RopeCase{256, 256, 1000000.0f, 8.0f, true, RopeMode::kNormal},
                      RopeCase{6, 2, 100.0f, 1.0f, false, RopeMode::kNeox}));

// YaRN on a Qwen-like rotation (128 dims, base 1e6, 32k trained, 4x): pairs turning more than
// 32 times over 32k positions (pair index <= 23 here: 128 ln(32768 / (32 * 2 pi)) / (2 ln 1e6)
// = 23.6, floored) keep their frequency; pairs turning less than once (index >= 40: 39.65,
// rounded up) are interpolated 4x; those between blend linearly. cos and sin grow by
// 1 + 0.1 ln 4.
TEST(Rope, YarnKeepsFastPairsInterpolatesSlowOnesAndScales) {
  RopeConfig cfg;
  cfg.head_dim = 128;
  cfg.n_rot = 128;
  cfg.freq_base = 1e6f;
  cfg.mode = RopeMode::kNeox;
  const Rope plain(cfg);
  cfg.yarn.factor = 4.0f;
  cfg.yarn.orig_ctx = 32768;
  const Rope yarn(cfg);
  const auto& p = plain.inv_freq();
  const auto& y = yarn.inv_freq();
  for (int i = 0; i <= 23; ++i) EXPECT_DOUBLE_EQ(y[static_cast<size_t>(i)], p[static_cast<size_t>(i)]) << i;
  for (int i = 40; i < 64; ++i) EXPECT_DOUBLE_EQ(y[static_cast<size_t>(i)], p[static_cast<size_t>(i)] / 4.0) << i;
  const double keep = 1.0 - (31.0 - 23.0) / (40.0 - 23.0);
  EXPECT_NEAR(y[31], p[31] * keep + p[31] / 4.0 * (1.0 - keep), 1e-15 * p[31]);
  const double mscale = 1.0 + 0.1 * std::log(4.0);
  EXPECT_NEAR(yarn.mscale(), mscale, 1e-12);
  EXPECT_EQ(plain.mscale(), 1.0);
  std::vector<float> c(64), sn(64);
  yarn.angles(1000, c.data(), sn.data());
  for (int i : {0, 31, 63}) {
    const double theta = 1000.0 * y[static_cast<size_t>(i)];
    EXPECT_NEAR(c[static_cast<size_t>(i)], std::cos(theta) * mscale, 1e-6) << i;
    EXPECT_NEAR(sn[static_cast<size_t>(i)], std::sin(theta) * mscale, 1e-6) << i;
  }
  // attn_factor multiplies the scaling.
  cfg.yarn.attn_factor = 0.5f;
  EXPECT_NEAR(Rope(cfg).mscale(), 0.5 * mscale, 1e-12);
}

TEST(Rope, ModesRotateDifferentPairs) {
  RopeConfig cfg;
  cfg.head_dim = 8;
  cfg.n_rot = 8;
  cfg.mode = RopeMode::kNormal;
  const Rope normal(cfg);
  cfg.mode = RopeMode::kNeox;
  const Rope neox(cfg);
  // x = e_0: normal order rotates it into dim 1, NeoX order into dim 4.
  std::vector<float> a(8, 0.0f), b(8, 0.0f);
  a[0] = b[0] = 1.0f;
  normal.apply(a.data(), 1, 1);
  neox.apply(b.data(), 1, 1);
  EXPECT_NEAR(a[0], std::cos(1.0), 1e-7);
  EXPECT_NEAR(a[1], std::sin(1.0), 1e-7);
  EXPECT_EQ(a[4], 0.0f);
  EXPECT_NEAR(b[0], std::cos(1.0), 1e-7);
  EXPECT_NEAR(b[4], std::sin(1.0), 1e-7);
  EXPECT_EQ(b[1], 0.0f);
}

}  // namespace
}  // namespace metro::kernels
