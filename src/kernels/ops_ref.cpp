// Scalar references of the elementwise ops. Sums and transcendental functions run in
// double and round once to float, so each output is within about one float rounding of
// the exact value; the SIMD variants are tested against these with bounds derived from
// their own (float) evaluation order.
#include <cmath>
#include <limits>
#include <numbers>

#include "kernels/ops.h"
#include "kernels/ops_table.h"

namespace metro::kernels {

namespace {
double silu_d(double v) { return v / (1.0 + std::exp(-v)); }
}  // namespace

namespace ref {

void rms_norm(const float* x, const float* weight, float* y, int64_t n, float eps) {
  double ss = 0.0;
  for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(x[i]) * x[i];
  const double inv = 1.0 / std::sqrt(ss / static_cast<double>(n) + eps);
  for (int64_t i = 0; i < n; ++i) y[i] = static_cast<float>(x[i] * inv * weight[i]);
}

void swiglu(const float* gate, const float* up, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<float>(silu_d(gate[i]) * up[i]);
}

void silu(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = static_cast<float>(silu_d(x[i]));
}

void gelu(const float* x, float* y, int64_t n) {
  const double k = std::sqrt(2.0 / std::numbers::pi);
  for (int64_t i = 0; i < n; ++i) {
    const double v = x[i];
    // 0.5 v (1 + tanh z) written as v / (1 + e^(-2z)): equal, but without the cancellation
    // of 1 + tanh(z) where tanh(z) rounds to -1.
    y[i] = static_cast<float>(v / (1.0 + std::exp(-2.0 * k * (v + 0.044715 * v * v * v))));
  }
}

void softcap(float* x, int64_t n, float cap) {
  for (int64_t i = 0; i < n; ++i) {
    x[i] = static_cast<float>(cap * std::tanh(static_cast<double>(x[i]) / cap));
  }
}

void softmax(float* x, int64_t n) {
  if (n <= 0) return;
  float mx = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < n; ++i) mx = std::fmax(mx, x[i]);
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += std::exp(static_cast<double>(x[i]) - mx);
  const double inv = 1.0 / sum;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = static_cast<float>(std::exp(static_cast<double>(x[i]) - mx) * inv);
  }
}

void add(const float* a, const float* b, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

void mul(const float* a, const float* b, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] * b[i];
}

void scale(float* x, float s, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] *= s;
}

float dot_f32(const float* a, const float* b, int64_t n) {
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(a[i]) * b[i];
  return static_cast<float>(sum);
}

void exp_f32(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = static_cast<float>(std::exp(static_cast<double>(x[i])));
}

float softmax_weights(const float* x, float* y, int64_t n, float scale) {
  float mx = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < n; ++i) mx = std::fmax(mx, x[i]);
  for (int64_t i = 0; i < n; ++i) {
    y[i] = static_cast<float>(std::exp(static_cast<double>((x[i] - mx) * scale)));
  }
  return mx;
}

int64_t argmax(const float* x, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i) {
    if (x[i] > x[best] || (std::isnan(x[best]) && !std::isnan(x[i]))) best = i;
  }
  return best;
}

void rope_rotate(float* x, int n_head, int head_dim, int n_rot, RopeMode mode, const float* cos,
                 const float* sin) {
  const int half = n_rot / 2;
  for (int h = 0; h < n_head; ++h) {
    float* v = x + static_cast<int64_t>(h) * head_dim;
    for (int i = 0; i < half; ++i) {
      const int a = mode == RopeMode::kNormal ? 2 * i : i;
      const int b = mode == RopeMode::kNormal ? 2 * i + 1 : i + half;
      const double x0 = v[a];
      const double x1 = v[b];
      v[a] = static_cast<float>(x0 * cos[i] - x1 * sin[i]);
      v[b] = static_cast<float>(x0 * sin[i] + x1 * cos[i]);
    }
  }
}

}  // namespace ref

namespace detail {
const OpsTable kOpsScalar = {
    "scalar",     ref::rms_norm, ref::swiglu, ref::silu,    ref::gelu,    ref::softmax,
    ref::add,     ref::mul,      ref::scale,  ref::dot_f32, ref::exp_f32, ref::softmax_weights,
    ref::argmax,  ref::rope_rotate, ref::softcap,
};
}  // namespace detail

}  // namespace metro::kernels
