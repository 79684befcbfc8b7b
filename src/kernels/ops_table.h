// Internal to kernels/ops*: the table of elementwise kernels, one per instruction set.
// ops.cpp picks one table once (from base/cpu_features) and every public op calls through
// it, so hot loops never test CPU features.
#pragma once

#include <cstdint>
#include <string_view>

#include "kernels/ops.h"

namespace metro::kernels::detail {

struct OpsTable {
  std::string_view isa;
  void (*rms_norm)(const float* x, const float* weight, float* y, int64_t n, float eps);
  void (*swiglu)(const float* gate, const float* up, float* out, int64_t n);
  void (*silu)(const float* x, float* y, int64_t n);
  void (*gelu)(const float* x, float* y, int64_t n);
  void (*softmax)(float* x, int64_t n);
  void (*add)(const float* a, const float* b, float* out, int64_t n);
  void (*mul)(const float* a, const float* b, float* out, int64_t n);
  void (*scale)(float* x, float s, int64_t n);
  float (*dot_f32)(const float* a, const float* b, int64_t n);
  void (*exp_f32)(const float* x, float* y, int64_t n);
  float (*softmax_weights)(const float* x, float* y, int64_t n, float scale);
  int64_t (*argmax)(const float* x, int64_t n);
  void (*rope_rotate)(float* x, int n_head, int head_dim, int n_rot, RopeMode mode,
                      const float* cos, const float* sin);
  void (*softcap)(float* x, int64_t n, float cap);
};

extern const OpsTable kOpsScalar;  // ops_ref.cpp
extern const OpsTable kOpsAvx2;    // ops_avx2.cpp; only used when the CPU has AVX2+FMA+F16C

}  // namespace metro::kernels::detail
