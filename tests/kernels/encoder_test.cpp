// The encoder kernels (layer norm, exact GELU, bidirectional attention of one head) against
// their double-precision definitions.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "kernels/encoder.h"

namespace metro::kernels {
namespace {

std::vector<float> random_vec(size_t n, float lo, float hi, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

TEST(EncoderKernels, LayerNormMatchesReference) {
  for (int64_t n : {1, 7, 32, 384, 1024}) {
    // A large common offset: the variance must not lose its precision to the mean.
    std::vector<float> x = random_vec(static_cast<size_t>(n), 99.0f, 101.0f, 1);
    const auto w = random_vec(static_cast<size_t>(n), 0.5f, 1.5f, 2), b = random_vec(static_cast<size_t>(n), -1.0f, 1.0f, 3);
    std::vector<float> got(static_cast<size_t>(n)), want(static_cast<size_t>(n));
    layer_norm(x.data(), w.data(), b.data(), got.data(), n, 1e-12f);
    ref::layer_norm(x.data(), w.data(), b.data(), want.data(), n, 1e-12f);
    for (int64_t i = 0; i < n; ++i) EXPECT_NEAR(got[static_cast<size_t>(i)], want[static_cast<size_t>(i)], 2e-5) << n << " " << i;
    if (n > 1) {  // normalized: zero mean, unit variance before the affine part
      std::vector<float> ones(static_cast<size_t>(n), 1.0f), zeros(static_cast<size_t>(n), 0.0f);
      layer_norm(x.data(), ones.data(), zeros.data(), got.data(), n, 1e-12f);
      double m = 0.0, v = 0.0;
      for (float g : got) m += g;
      m /= static_cast<double>(n);
      for (float g : got) v += (g - m) * (g - m);
      EXPECT_NEAR(m, 0.0, 1e-5);
      EXPECT_NEAR(v / static_cast<double>(n), 1.0, 1e-4);
    }
  }
}

TEST(EncoderKernels, GeluErfMatchesReference) {
  std::vector<float> x = random_vec(4096, -8.0f, 8.0f, 4);
  x.insert(x.end(), {0.0f, -0.0f, 1.0f, -1.0f, 30.0f, -30.0f});
  std::vector<float> got(x.size()), want(x.size());
  gelu_erf(x.data(), got.data(), static_cast<int64_t>(x.size()));
  ref::gelu_erf(x.data(), want.data(), static_cast<int64_t>(x.size()));
  for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-6 + 1e-6 * std::fabs(want[i])) << x[i];
  EXPECT_NEAR(want[x.size() - 4], 0.8413447f, 1e-6);  // Phi(1)
  EXPECT_EQ(want[x.size() - 1], -0.0f);
}

TEST(EncoderKernels, AttentionHeadMatchesReference) {
  const int hd = 32;
  for (int n : {1, 2, 5, 37, 130}) {
    // Rows wider than the head: the head's values sit at an offset inside each token's row.
    const size_t q_stride = 3 * hd, kv_stride = 2 * hd, out_stride = 4 * hd;
    const auto q = random_vec(static_cast<size_t>(n) * q_stride, -2.0f, 2.0f, 5);
    const auto k = random_vec(static_cast<size_t>(n) * kv_stride, -2.0f, 2.0f, 6);
    const auto v = random_vec(static_cast<size_t>(n) * kv_stride, -1.0f, 1.0f, 7);
    std::vector<float> got(static_cast<size_t>(n) * out_stride, 7.0f), want(got);
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
    encoder_attention_head(q.data() + hd, q_stride, k.data() + hd, v.data() + hd, kv_stride, got.data() + hd, out_stride,
                           n, hd, scale);
    ref::encoder_attention_head(q.data() + hd, q_stride, k.data() + hd, v.data() + hd, kv_stride, want.data() + hd,
                                out_stride, n, hd, scale);
    for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 2e-5) << n << " " << i;
    EXPECT_EQ(got[0], 7.0f);  // nothing outside the head's columns is written
  }
}

// Bidirectional: the first query's output depends on the last key (a causal kernel's would
// not).
TEST(EncoderKernels, AttentionSeesLaterKeys) {
  const int hd = 8, n = 4;
  auto q = random_vec(n * hd, -1.0f, 1.0f, 8), k = random_vec(n * hd, -1.0f, 1.0f, 9), v = random_vec(n * hd, -1.0f, 1.0f, 10);
  std::vector<float> a(n * hd), b(n * hd);
  encoder_attention_head(q.data(), hd, k.data(), v.data(), hd, a.data(), hd, n, hd, 0.5f);
  v[(n - 1) * hd] += 5.0f;
  encoder_attention_head(q.data(), hd, k.data(), v.data(), hd, b.data(), hd, n, hd, 0.5f);
  EXPECT_NE(a[0], b[0]);
}

}  // namespace
}  // namespace metro::kernels
