#include "kernels/encoder.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "base/check.h"
#include "kernels/ops.h"

namespace metro::kernels {

void layer_norm(const float* x, const float* weight, const float* bias, float* y, int64_t n, float eps) {
  // Two passes in double: the variance of values around a large mean keeps its precision.
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += x[i];
  const double mean = sum / static_cast<double>(n);
  double sq = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const double d = x[i] - mean;
    sq += d * d;
  }
  const float inv = static_cast<float>(1.0 / std::sqrt(sq / static_cast<double>(n) + eps));
  const float m = static_cast<float>(mean);
  for (int64_t i = 0; i < n; ++i) y[i] = (x[i] - m) * inv * weight[i] + bias[i];
}

void gelu_erf(const float* x, float* y, int64_t n) {
  constexpr float kInvSqrt2 = 0.70710678118654752f;
  for (int64_t i = 0; i < n; ++i) y[i] = 0.5f * x[i] * (1.0f + std::erf(x[i] * kInvSqrt2));
}

void encoder_attention_head(const float* q, size_t q_stride, const float* k, const float* v, size_t kv_stride,
                            float* out, size_t out_stride, int n, int head_dim, float scale) {
  METRO_CHECK(n > 0 && n <= kMaxEncoderTokens && head_dim > 0);
  float s[kMaxEncoderTokens];
  for (int i = 0; i < n; ++i) {
    const float* qi = q + static_cast<size_t>(i) * q_stride;
    for (int j = 0; j < n; ++j) s[j] = dot_f32(qi, k + static_cast<size_t>(j) * kv_stride, head_dim);
    softmax_weights(s, s, n, scale);  // unnormalised, the largest 1
    float total = 0.0f;
    for (int j = 0; j < n; ++j) total += s[j];
    const float inv = 1.0f / total;
    float* o = out + static_cast<size_t>(i) * out_stride;
    std::fill(o, o + head_dim, 0.0f);
    for (int j = 0; j < n; ++j) {
      const float w = s[j] * inv;
      const float* vj = v + static_cast<size_t>(j) * kv_stride;
      for (int d = 0; d < head_dim; ++d) o[d] += w * vj[d];
    }
  }
}

namespace ref {

void layer_norm(const float* x, const float* weight, const float* bias, float* y, int64_t n, float eps) {
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += x[i];
  const double mean = sum / static_cast<double>(n);
  double sq = 0.0;
  for (int64_t i = 0; i < n; ++i) sq += (x[i] - mean) * (x[i] - mean);
  const double inv = 1.0 / std::sqrt(sq / static_cast<double>(n) + static_cast<double>(eps));
  for (int64_t i = 0; i < n; ++i) {
    y[i] = static_cast<float>((x[i] - mean) * inv * static_cast<double>(weight[i]) + static_cast<double>(bias[i]));
  }
}

void gelu_erf(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const double v = x[i];
    y[i] = static_cast<float>(0.5 * v * (1.0 + std::erf(v / std::sqrt(2.0))));
  }
}

void encoder_attention_head(const float* q, size_t q_stride, const float* k, const float* v, size_t kv_stride,
                            float* out, size_t out_stride, int n, int head_dim, float scale) {
  std::vector<double> s(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    const float* qi = q + static_cast<size_t>(i) * q_stride;
    double mx = -std::numeric_limits<double>::infinity();
    for (int j = 0; j < n; ++j) {
      double dot = 0.0;
      for (int d = 0; d < head_dim; ++d) dot += static_cast<double>(qi[d]) * k[static_cast<size_t>(j) * kv_stride + static_cast<size_t>(d)];
      s[static_cast<size_t>(j)] = dot * scale;
      mx = std::max(mx, s[static_cast<size_t>(j)]);
    }
    double total = 0.0;
    for (double& e : s) {
      e = std::exp(e - mx);
      total += e;
    }
    for (int d = 0; d < head_dim; ++d) {
      double acc = 0.0;
      for (int j = 0; j < n; ++j) acc += s[static_cast<size_t>(j)] * v[static_cast<size_t>(j) * kv_stride + static_cast<size_t>(d)];
      out[static_cast<size_t>(i) * out_stride + static_cast<size_t>(d)] = static_cast<float>(acc / total);
    }
  }
}

}  // namespace ref

}  // namespace metro::kernels
