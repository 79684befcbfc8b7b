#include "kernels/kernel_test_util.h"

#include <algorithm>
#include <cmath>

#include "kernels/ops.h"
#include "kernels/quant_ref.h"

namespace metro::kernels::testing {

std::vector<float> make_data(Dist dist, int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(n));
  float block_value = 0.0f, block_scale = 1.0f;
  for (int64_t i = 0; i < n; ++i) {
    if (i % 32 == 0) {
      block_value = normal(rng);
      block_scale = std::pow(10.0f, 4.0f * unit(rng) - 2.0f);
    }
    float v = 0.0f;
    switch (dist) {
      case Dist::kNormal: v = normal(rng); break;
      case Dist::kUniform: v = 2.0f * unit(rng) - 1.0f; break;
      case Dist::kPositive: v = 0.1f + 1.9f * unit(rng); break;
      case Dist::kNegative: v = -0.1f - 1.9f * unit(rng); break;
      case Dist::kOutliers: v = i % 64 == 17 ? 20.0f * (unit(rng) < 0.5f ? -1.0f : 1.0f) : 0.1f * normal(rng); break;
      case Dist::kWideRange: v = block_scale * normal(rng); break;
      case Dist::kConstant: v = block_value; break;
      case Dist::kSparse: v = unit(rng) < 0.1f ? normal(rng) : 0.0f; break;
    }
    x[static_cast<size_t>(i)] = v;
  }
  return x;
}

std::vector<uint8_t> quantize(DType t, const std::vector<float>& x) {
  const auto n = static_cast<int64_t>(x.size());
  std::vector<uint8_t> q(row_bytes(t, n));
  quantize_row_ref(t, x.data(), q.data(), n);
  return q;
}

std::vector<float> dequantize(DType t, const std::vector<uint8_t>& q, int64_t n) {
  std::vector<float> x(static_cast<size_t>(n));
  dequantize_row_ref(t, q.data(), x.data(), n);
  return x;
}

std::vector<DType> weight_types() {
  return {DType::kF32,  DType::kF16,  DType::kBF16, DType::kQ8_0, DType::kQ4_0, DType::kQ4_1, DType::kQ5_0,
          DType::kQ5_1, DType::kQ2_K, DType::kQ3_K, DType::kQ4_K, DType::kQ5_K, DType::kQ6_K};
}

double attention_row_tolerance(const float* q, const float* k, const float* v, int64_t n_keys,
                               int head_dim, float scale, int score_depth) {
  constexpr double kU = 0x1p-24;
  double s_abs = 0, v_abs = 0, s_max = -1e300, s_min = 1e300;
  for (int64_t pos = 0; pos < n_keys; ++pos) {
    const float* kr = k + pos * head_dim;
    const float* vr = v + pos * head_dim;
    double sa = 0, s = 0;
    for (int c = 0; c < head_dim; ++c) {
      sa += std::fabs(static_cast<double>(q[c]) * kr[c]);
      s += static_cast<double>(q[c]) * kr[c];
      v_abs = std::max(v_abs, std::fabs(static_cast<double>(vr[c])));
    }
    s_abs = std::max(s_abs, sa * scale);
    s_max = std::max(s_max, s * scale);
    s_min = std::min(s_min, s * scale);
  }
  const double nd = static_cast<double>(n_keys);
  const double delta = (score_depth + 3) * kU * s_abs;
  const double eps = 2 * delta + kExpMaxRelError + kU * (s_max - s_min) + 2 * kU * (nd / 32 + 1);
  return 2 * eps * v_abs + (nd + nd / 32 + 10) * kU * v_abs;
}

}  // namespace metro::kernels::testing
