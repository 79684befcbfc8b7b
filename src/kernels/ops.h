// Elementwise and reduction kernels on F32 rows. All are single-row (or single-token)
// functions; callers split rows among threads. Each has a scalar reference (ops_ref.cpp)
// and, where it pays, an AVX2 variant chosen at run time.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

namespace metro::kernels {

// y = x / sqrt(mean(x^2) + eps) * weight  (y may alias x)
void rms_norm(const float* x, const float* weight, float* y, int64_t n, float eps);

// out = silu(gate) * up, silu(v) = v / (1 + exp(-v))  (out may alias gate or up)
void swiglu(const float* gate, const float* up, float* out, int64_t n);
void silu(const float* x, float* y, int64_t n);
// tanh approximation, as GGUF models' reference uses
void gelu(const float* x, float* y, int64_t n);
// In place, numerically stable (max subtracted). -inf entries get 0; at least one entry
// must be finite.
void softmax(float* x, int64_t n);
void add(const float* a, const float* b, float* out, int64_t n);
void mul(const float* a, const float* b, float* out, int64_t n);
void scale(float* x, float s, int64_t n);
float dot_f32(const float* a, const float* b, int64_t n);
// y = e^x elementwise (y may alias x). The vectorized variant has a relative error below
// kExpMaxRelError for finite results; it overflows to +inf above ~88.72 and flushes to 0
// (through the subnormals) below ~-103.9.
void exp_f32(const float* x, float* y, int64_t n);
// Measured worst case 7.9e-8 over 1e8 random and swept inputs (ops_test.cpp sweeps 2^20).
inline constexpr double kExpMaxRelError = 1.2e-7;  // about one float ulp
// y = e^((x - m) * scale) with m = max(x), returned: the unnormalised weights of a softmax at
// temperature 1/scale (the largest is 1; -inf entries get 0). At least one entry must be
// finite; y may alias x. What a sampler draws from.
float softmax_weights(const float* x, float* y, int64_t n, float scale);
// x = cap * tanh(x / cap) in place: gemma2's soft-capping of attention scores and logits.
// cap <= 0 leaves x as it is. The vectorized variant's absolute error is about cap times
// kExpMaxRelError.
void softcap(float* x, int64_t n, float cap);
// The first index of the largest value (NaN entries never win; 0 if all are NaN or n is 0).
int64_t argmax(const float* x, int64_t n);

// Which instruction set the elementwise ops run on here ("avx2" or "scalar").
std::string_view ops_isa();

enum class RopeMode : uint8_t {
  kNormal,  // rotate (x[2i], x[2i+1])
  kNeox,    // rotate (x[i], x[i + n_rot/2])
};

// YaRN context extension: pairs that turn fewer than beta_slow times over the original
// context are interpolated (frequency divided by `factor`), pairs that turn more than
// beta_fast times keep their frequency, and those between blend linearly in the pair index;
// cos and sin are scaled by attn_factor * (1 + 0.1 ln factor), which keeps the attention
// logits' temperature.
struct YarnConfig {
  float factor = 1.0f;     // > 1 enables it
  int orig_ctx = 0;        // the context the model was trained with before extension
  float beta_fast = 32.0f;
  float beta_slow = 1.0f;
  float attn_factor = 1.0f;
};

// Rotary position embedding tables: inverse frequencies per rotated pair, with linear
// scaling (positions divided by `linear_scale`), llama3-style per-pair frequency factors
// (frequency divided by factor[i]) or YaRN applied.
struct RopeConfig {
  int head_dim = 0;
  int n_rot = 0;  // rotated dims per head (<= head_dim, even); the rest pass through
  float freq_base = 10000.0f;
  float linear_scale = 1.0f;
  const float* freq_factors = nullptr;  // n_rot/2 values or null
  float attn_factor = 1.0f;             // cos and sin multiplied by it (YaRN: yarn.attn_factor instead)
  RopeMode mode = RopeMode::kNormal;
  YarnConfig yarn;
};

// The inverse frequency of each rotated pair (n_rot/2 values) and the factor cos and sin
// are multiplied by: the closed form the fast path and the double reference share.
struct RopeFrequencies {
  std::vector<double> inv_freq;
  double mscale = 1.0;
};
RopeFrequencies rope_frequencies(const RopeConfig& cfg);

// Angles are computed in double from the closed form theta_i = pos / linear_scale *
// freq_base^(-2i/n_rot) / factor_i, so long positions lose no precision.
class Rope {
 public:
  // n_rot even, 0 < n_rot <= head_dim, n_rot <= kMaxRot. freq_factors is read here only
  // (config() keeps the caller's pointer, which may dangle later).
  explicit Rope(const RopeConfig& cfg);
  // Rotates n_head heads of one token (x: [n_head][head_dim]) to position pos.
  void apply(float* x, int n_head, int64_t pos) const;

  // The same in two steps, so a forward pass computes the angles of a token once and
  // reuses them for Q and K of every layer: cos/sin hold n_rot/2 values.
  void angles(int64_t pos, float* cos_out, float* sin_out) const;
  void apply(float* x, int n_head, const float* cos, const float* sin) const;

  const RopeConfig& config() const { return cfg_; }
  // theta_i / pos for each rotated pair (n_rot/2 values, scaling and factors applied): what
  // a device backend computes the angles from, the same way angles() does.
  const std::vector<double>& inv_freq() const { return inv_freq_; }
  // What cos and sin are multiplied by (YaRN's attention scaling; 1 otherwise).
  double mscale() const { return mscale_; }
  static constexpr int kMaxRot = 512;

 private:
  RopeConfig cfg_;
  std::vector<double> inv_freq_;  // n_rot/2, scaling and factors applied
  double mscale_ = 1.0;
};

// Scalar references: the definition of what the dispatched kernels compute, and the
// fallback on CPUs without AVX2. Sums and transcendental functions are evaluated in double
// and rounded once, so they are accurate to about one float rounding per element.
namespace ref {
void rms_norm(const float* x, const float* weight, float* y, int64_t n, float eps);
void swiglu(const float* gate, const float* up, float* out, int64_t n);
void silu(const float* x, float* y, int64_t n);
void gelu(const float* x, float* y, int64_t n);
void softmax(float* x, int64_t n);
void add(const float* a, const float* b, float* out, int64_t n);
void mul(const float* a, const float* b, float* out, int64_t n);
void scale(float* x, float s, int64_t n);
float dot_f32(const float* a, const float* b, int64_t n);
void exp_f32(const float* x, float* y, int64_t n);
float softmax_weights(const float* x, float* y, int64_t n, float scale);
int64_t argmax(const float* x, int64_t n);
void softcap(float* x, int64_t n, float cap);  // cap > 0
// Rotates pairs of n_head heads (x: [n_head][head_dim]) by angles with cos/sin given per
// pair (n_rot/2 values); dims past n_rot pass through.
void rope_rotate(float* x, int n_head, int head_dim, int n_rot, RopeMode mode, const float* cos,
                 const float* sin);
}  // namespace ref

}  // namespace metro::kernels
