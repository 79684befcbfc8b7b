#include "kernels/dtype.h"

#include "base/check.h"

namespace metro::kernels {

namespace {
using G = gguf::GgmlType;
constexpr DTypeTraits kTraits[kNumDTypes] = {
    {"F32", 1, 4, false, DType::kF32, G::kF32},
    {"F16", 1, 2, false, DType::kF32, G::kF16},
    {"BF16", 1, 2, false, DType::kF32, G::kBF16},
    {"Q8_0", 32, 34, true, DType::kQ8_0, G::kQ8_0},
    {"Q4_0", 32, 18, true, DType::kQ8_0, G::kQ4_0},
    {"Q4_1", 32, 20, true, DType::kQ8_1, G::kQ4_1},
    {"Q5_0", 32, 22, true, DType::kQ8_0, G::kQ5_0},
    {"Q5_1", 32, 24, true, DType::kQ8_1, G::kQ5_1},
    {"Q4_K", 256, 144, true, DType::kQ8_K, G::kQ4_K},
    {"Q5_K", 256, 176, true, DType::kQ8_K, G::kQ5_K},
    {"Q6_K", 256, 210, true, DType::kQ8_K, G::kQ6_K},
    {"Q8_1", 32, 36, true, DType::kQ8_1, G::kQ8_1},
    {"Q8_K", 256, 292, true, DType::kQ8_K, G::kQ8_K},
    {"Q2_K", 256, 84, true, DType::kQ8_K, G::kQ2_K},
    {"Q3_K", 256, 110, true, DType::kQ8_K, G::kQ3_K},
};
}  // namespace

const DTypeTraits& traits(DType t) {
  METRO_CHECK(static_cast<int>(t) < kNumDTypes);
  return kTraits[static_cast<int>(t)];
}

std::optional<DType> dtype_from_ggml(gguf::GgmlType g) {
  for (int i = 0; i < kNumDTypes; ++i) {
    if (kTraits[i].ggml == g) return static_cast<DType>(i);
  }
  return std::nullopt;
}

}  // namespace metro::kernels
