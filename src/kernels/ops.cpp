// Public elementwise ops: thin calls through the kernel table chosen once for this CPU,
// and the RoPE angle tables.
#include "kernels/ops.h"

#include <cmath>

#include "base/check.h"
#include "base/cpu_features.h"
#include "kernels/ops_table.h"

namespace metro::kernels {

namespace {

const detail::OpsTable& table() {
  static const detail::OpsTable& t =
      cpu_features().has_avx2_level() ? detail::kOpsAvx2 : detail::kOpsScalar;
  return t;
}

}  // namespace

void rms_norm(const float* x, const float* weight, float* y, int64_t n, float eps) {
  table().rms_norm(x, weight, y, n, eps);
}
void swiglu(const float* gate, const float* up, float* out, int64_t n) {
  table().swiglu(gate, up, out, n);
}
void silu(const float* x, float* y, int64_t n) { table().silu(x, y, n); }
void gelu(const float* x, float* y, int64_t n) { table().gelu(x, y, n); }
void softmax(float* x, int64_t n) { table().softmax(x, n); }
void add(const float* a, const float* b, float* out, int64_t n) { table().add(a, b, out, n); }
void mul(const float* a, const float* b, float* out, int64_t n) { table().mul(a, b, out, n); }
void scale(float* x, float s, int64_t n) { table().scale(x, s, n); }
float dot_f32(const float* a, const float* b, int64_t n) { return table().dot_f32(a, b, n); }
void exp_f32(const float* x, float* y, int64_t n) { table().exp_f32(x, y, n); }
float softmax_weights(const float* x, float* y, int64_t n, float scale) {
  return table().softmax_weights(x, y, n, scale);
}
int64_t argmax(const float* x, int64_t n) { return table().argmax(x, n); }
std::string_view ops_isa() { return table().isa; }

Rope::Rope(const RopeConfig& cfg) : cfg_(cfg) {
  METRO_CHECK_MSG(cfg.n_rot > 0 && cfg.n_rot % 2 == 0 && cfg.n_rot <= cfg.head_dim &&
                      cfg.n_rot <= kMaxRot,
                  "Rope: n_rot must be even, positive, <= head_dim and <= kMaxRot");
  METRO_CHECK_MSG(cfg.freq_base > 0.0f && cfg.linear_scale > 0.0f,
                  "Rope: freq_base and linear_scale must be positive");
  const int half = cfg.n_rot / 2;
  inv_freq_.resize(static_cast<size_t>(half));
  for (int i = 0; i < half; ++i) {
    double f = std::pow(static_cast<double>(cfg.freq_base), -2.0 * i / cfg.n_rot);
    if (cfg.freq_factors) {
      METRO_CHECK_MSG(cfg.freq_factors[i] > 0.0f, "Rope: frequency factors must be positive");
      f /= static_cast<double>(cfg.freq_factors[i]);
    }
    inv_freq_[static_cast<size_t>(i)] = f / static_cast<double>(cfg.linear_scale);
  }
}

void Rope::angles(int64_t pos, float* cos_out, float* sin_out) const {
  const double p = static_cast<double>(pos);
  for (size_t i = 0; i < inv_freq_.size(); ++i) {
    const double theta = p * inv_freq_[i];
    cos_out[i] = static_cast<float>(std::cos(theta));
    sin_out[i] = static_cast<float>(std::sin(theta));
  }
}

void Rope::apply(float* x, int n_head, const float* cos, const float* sin) const {
  table().rope_rotate(x, n_head, cfg_.head_dim, cfg_.n_rot, cfg_.mode, cos, sin);
}

void Rope::apply(float* x, int n_head, int64_t pos) const {
  float c[kMaxRot / 2];
  float s[kMaxRot / 2];
  angles(pos, c, s);
  apply(x, n_head, c, s);
}

}  // namespace metro::kernels
