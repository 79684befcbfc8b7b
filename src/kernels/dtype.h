// The closed set of element types metro computes with, and their block geometry.
//
// Weight types come from GGUF. Activation partner types (Q8_0 for the 32-blocks, Q8_1 for
// the 32-blocks with a min, Q8_K for the 256-block K-quants) are what F32 activations are
// quantized to on the fly so a dot product runs on 8-bit integers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

#include "gguf/ggml_type.h"

namespace metro::kernels {

enum class DType : uint8_t {
  kF32,
  kF16,
  kBF16,
  kQ8_0,
  kQ4_0,
  kQ4_1,
  kQ5_0,
  kQ5_1,
  kQ4_K,
  kQ5_K,
  kQ6_K,
  kQ8_1,  // activation partner of Q4_1 / Q5_1 (block sum carried)
  kQ8_K,  // activation partner of the K-quants (256-blocks, 16-element sums)
  kQ2_K,
  kQ3_K,
  kCount,
};

inline constexpr int kNumDTypes = static_cast<int>(DType::kCount);

struct DTypeTraits {
  std::string_view name;
  int block_size;        // elements per block
  int bytes_per_block;   // bytes per block
  bool quantized;
  DType dot_partner;     // the type activations are quantized to for W·x with this weight type
  gguf::GgmlType ggml;   // the GGUF type id
};

const DTypeTraits& traits(DType t);
inline std::string_view dtype_name(DType t) { return traits(t).name; }

// The DType of a GGUF tensor type; nullopt for GGUF types metro does not compute with.
std::optional<DType> dtype_from_ggml(gguf::GgmlType t);

// Bytes of one row of n elements (n must be a multiple of the block size).
inline size_t row_bytes(DType t, int64_t n) {
  const auto& tr = traits(t);
  return static_cast<size_t>(n / tr.block_size) * static_cast<size_t>(tr.bytes_per_block);
}

}  // namespace metro::kernels
