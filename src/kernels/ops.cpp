// Public elementwise ops: thin calls through the kernel table chosen once for this CPU,
// and the RoPE angle tables.
#include "kernels/ops.h"

#include <algorithm>
#include <cmath>
#include <numbers>

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
void softcap(float* x, int64_t n, float cap) {
  if (cap > 0.0f) table().softcap(x, n, cap);
}
std::string_view ops_isa() { return table().isa; }

Rope::Rope(const RopeConfig& cfg) : cfg_(cfg) {
  METRO_CHECK_MSG(cfg.n_rot > 0 && cfg.n_rot % 2 == 0 && cfg.n_rot <= cfg.head_dim &&
                      cfg.n_rot <= kMaxRot,
                  "Rope: n_rot must be even, positive, <= head_dim and <= kMaxRot");
  METRO_CHECK_MSG(cfg.freq_base > 0.0f && cfg.linear_scale > 0.0f,
                  "Rope: freq_base and linear_scale must be positive");
  if (cfg.freq_factors) {
    for (int i = 0; i < cfg.n_rot / 2; ++i) {
      METRO_CHECK_MSG(cfg.freq_factors[i] > 0.0f, "Rope: frequency factors must be positive");
    }
  }
  METRO_CHECK_MSG(cfg.yarn.factor <= 1.0f || cfg.yarn.orig_ctx > 0, "Rope: YaRN needs the original context");
  RopeFrequencies f = rope_frequencies(cfg);
  inv_freq_ = std::move(f.inv_freq);
  mscale_ = f.mscale;
}

RopeFrequencies rope_frequencies(const RopeConfig& cfg) {
  const int half = cfg.n_rot / 2;
  const double base = cfg.freq_base;
  const bool yarn = cfg.yarn.factor > 1.0f;
  // The pair index at which a rotation turns `turns` times over the original context.
  auto pair_at = [&](double turns) {
    return cfg.n_rot * std::log(static_cast<double>(cfg.yarn.orig_ctx) / (turns * 2.0 * std::numbers::pi)) / (2.0 * std::log(base));
  };
  double low = 0, high = 0;
  if (yarn) {
    low = std::max(0.0, std::floor(pair_at(cfg.yarn.beta_fast)));
    high = std::min(static_cast<double>(cfg.n_rot - 1), std::ceil(pair_at(cfg.yarn.beta_slow)));
  }
  RopeFrequencies out;
  out.inv_freq.resize(static_cast<size_t>(half));
  for (int i = 0; i < half; ++i) {
    double f = std::pow(base, -2.0 * i / cfg.n_rot);
    if (cfg.freq_factors) f /= static_cast<double>(cfg.freq_factors[i]);
    f /= static_cast<double>(cfg.linear_scale);
    if (yarn) {
      // 1 below `low` (keep the frequency), 0 above `high` (interpolate), linear between.
      const double keep = 1.0 - std::clamp((i - low) / std::max(0.001, high - low), 0.0, 1.0);
      f = f / cfg.yarn.factor * (1.0 - keep) + f * keep;
    }
    out.inv_freq[static_cast<size_t>(i)] = f;
  }
  out.mscale = yarn ? cfg.yarn.attn_factor * (1.0 + 0.1 * std::log(static_cast<double>(cfg.yarn.factor)))
                    : static_cast<double>(cfg.attn_factor);
  return out;
}

void Rope::angles(int64_t pos, float* cos_out, float* sin_out) const {
  const double p = static_cast<double>(pos);
  for (size_t i = 0; i < inv_freq_.size(); ++i) {
    const double theta = p * inv_freq_[i];
    cos_out[i] = static_cast<float>(std::cos(theta) * mscale_);
    sin_out[i] = static_cast<float>(std::sin(theta) * mscale_);
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
