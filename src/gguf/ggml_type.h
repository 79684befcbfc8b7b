// Tensor element types as numbered in the GGUF format (ggml's type ids), with the block
// geometry needed to size tensor data. This is format knowledge only; arithmetic on these
// formats lives in kernels/.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace metro::gguf {

enum class GgmlType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ8_1 = 9,
  kQ2_K = 10,
  kQ3_K = 11,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kQ8_K = 15,
  kIQ2_XXS = 16,
  kIQ2_XS = 17,
  kIQ3_XXS = 18,
  kIQ1_S = 19,
  kIQ4_NL = 20,
  kIQ3_S = 21,
  kIQ2_S = 22,
  kIQ4_XS = 23,
  kI8 = 24,
  kI16 = 25,
  kI32 = 26,
  kI64 = 27,
  kF64 = 28,
  kIQ1_M = 29,
  kBF16 = 30,
  kTQ1_0 = 34,
  kTQ2_0 = 35,
  kMXFP4 = 39,
};

struct GgmlTypeInfo {
  std::string_view name;
  uint32_t block_size;       // elements per block
  uint32_t bytes_per_block;  // bytes per block
};

// Geometry of a known type id; nullopt for ids the format does not define (or retired ids).
std::optional<GgmlTypeInfo> ggml_type_info(uint32_t type_id);

inline std::string_view ggml_type_name(GgmlType t) {
  auto info = ggml_type_info(static_cast<uint32_t>(t));
  return info ? info->name : std::string_view("unknown");
}

}  // namespace metro::gguf
