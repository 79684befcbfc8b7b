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

}  // namespace metro::kernels::testing
