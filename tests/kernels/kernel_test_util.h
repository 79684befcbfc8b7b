// Helpers shared by the kernel tests: test data and quantized rows.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "kernels/dtype.h"

namespace metro::kernels::testing {

// The shapes of data the quantizers must handle.
enum class Dist {
  kNormal,      // N(0, 1)
  kUniform,     // U(-1, 1)
  kPositive,    // U(0.1, 2): all positive (the min formats' min is > 0)
  kNegative,    // U(-2, -0.1)
  kOutliers,    // N(0, 0.1) with one value of magnitude ~20 per 64
  kWideRange,   // per block scale 10^U(-2, 2)
  kConstant,    // one value repeated per block
  kSparse,      // mostly zero, a few N(0,1)
};
inline constexpr Dist kAllDists[] = {Dist::kNormal,   Dist::kUniform,   Dist::kPositive,
                                     Dist::kNegative, Dist::kOutliers,  Dist::kWideRange,
                                     Dist::kConstant, Dist::kSparse};

std::vector<float> make_data(Dist dist, int64_t n, uint32_t seed);

// n floats -> bytes of `t` through the reference quantizer (a whole number of blocks).
std::vector<uint8_t> quantize(DType t, const std::vector<float>& x);
std::vector<float> dequantize(DType t, const std::vector<uint8_t>& q, int64_t n);

// The formats weights come in (every DType but the activation-only partners).
std::vector<DType> weight_types();

// Error bound of one output row (one query head) of a flash-attention kernel against the
// exact result, from the data. q: the query row; k, v: the n_keys rows [0, n_keys) of its
// KV head as stored (dequantized), head_dim values each. With u = 2^-24,
// S = scale * max_j sum_d |q_d k_jd|, V = max |v_jd|, n = n_keys, R = max_j |s_j - max s|,
// and D the depth of the score sums (head_dim bounds any order; head_dim/8 + 3 for 8 FMA
// lanes and a 3-level tree):
//   score error       delta <= (D + 3) u S             (+ the scaled q's rounding)
//   weight error      eps   <= 2 delta + e + u R + 2u n/32 (exp error e; rounded s - m;
//                                                          rescale multiplies per chunk)
//   output error            <= 2 eps V + (n + n/32 + 10) u V (weights' effect on a convex
//                                                             combination; the two sums)
double attention_row_tolerance(const float* q, const float* k, const float* v, int64_t n_keys,
                               int head_dim, float scale, int score_depth);

}  // namespace metro::kernels::testing
