// Elementwise and reduction kernels on F32 rows. All are single-row (or single-token)
// functions; callers split rows among threads. Each has a scalar reference (ops_ref.cpp)
// and, where it pays, an AVX2 variant chosen at run time.
#pragma once

#include <cstdint>
#include <vector>

namespace metro::kernels {

// y = x / sqrt(mean(x^2) + eps) * weight  (y may alias x)
void rms_norm(const float* x, const float* weight, float* y, int64_t n, float eps);

// out = silu(gate) * up, silu(v) = v / (1 + exp(-v))  (out may alias gate or up)
void swiglu(const float* gate, const float* up, float* out, int64_t n);
void silu(const float* x, float* y, int64_t n);
// tanh approximation, as GGUF models' reference uses
void gelu(const float* x, float* y, int64_t n);
// In place, numerically stable (max subtracted).
void softmax(float* x, int64_t n);
void add(const float* a, const float* b, float* out, int64_t n);
void mul(const float* a, const float* b, float* out, int64_t n);
void scale(float* x, float s, int64_t n);
float dot_f32(const float* a, const float* b, int64_t n);

enum class RopeMode : uint8_t {
  kNormal,  // rotate (x[2i], x[2i+1])
  kNeox,    // rotate (x[i], x[i + n_rot/2])
};

// Rotary position embedding tables: inverse frequencies per rotated pair, with linear
// scaling (positions divided by `linear_scale`) and llama3-style per-pair frequency factors
// (frequency divided by factor[i]) applied.
struct RopeConfig {
  int head_dim = 0;
  int n_rot = 0;  // rotated dims per head (<= head_dim, even); the rest pass through
  float freq_base = 10000.0f;
  float linear_scale = 1.0f;
  const float* freq_factors = nullptr;  // n_rot/2 values or null
  RopeMode mode = RopeMode::kNormal;
};

class Rope {
 public:
  explicit Rope(const RopeConfig& cfg);
  // Rotates n_head heads of one token (x: [n_head][head_dim]) to position pos.
  void apply(float* x, int n_head, int64_t pos) const;
  const RopeConfig& config() const { return cfg_; }

 private:
  RopeConfig cfg_;
  std::vector<float> inv_freq_;  // n_rot/2
};

}  // namespace metro::kernels
