#include "gguf/ggml_type.h"

namespace metro::gguf {

std::optional<GgmlTypeInfo> ggml_type_info(uint32_t type_id) {
  // Block geometry from the GGUF specification (ggml's type traits).
  switch (static_cast<GgmlType>(type_id)) {
    case GgmlType::kF32: return GgmlTypeInfo{"F32", 1, 4};
    case GgmlType::kF16: return GgmlTypeInfo{"F16", 1, 2};
    case GgmlType::kQ4_0: return GgmlTypeInfo{"Q4_0", 32, 18};
    case GgmlType::kQ4_1: return GgmlTypeInfo{"Q4_1", 32, 20};
    case GgmlType::kQ5_0: return GgmlTypeInfo{"Q5_0", 32, 22};
    case GgmlType::kQ5_1: return GgmlTypeInfo{"Q5_1", 32, 24};
    case GgmlType::kQ8_0: return GgmlTypeInfo{"Q8_0", 32, 34};
    case GgmlType::kQ8_1: return GgmlTypeInfo{"Q8_1", 32, 36};
    case GgmlType::kQ2_K: return GgmlTypeInfo{"Q2_K", 256, 84};
    case GgmlType::kQ3_K: return GgmlTypeInfo{"Q3_K", 256, 110};
    case GgmlType::kQ4_K: return GgmlTypeInfo{"Q4_K", 256, 144};
    case GgmlType::kQ5_K: return GgmlTypeInfo{"Q5_K", 256, 176};
    case GgmlType::kQ6_K: return GgmlTypeInfo{"Q6_K", 256, 210};
    case GgmlType::kQ8_K: return GgmlTypeInfo{"Q8_K", 256, 292};
    case GgmlType::kIQ2_XXS: return GgmlTypeInfo{"IQ2_XXS", 256, 66};
    case GgmlType::kIQ2_XS: return GgmlTypeInfo{"IQ2_XS", 256, 74};
    case GgmlType::kIQ3_XXS: return GgmlTypeInfo{"IQ3_XXS", 256, 98};
    case GgmlType::kIQ1_S: return GgmlTypeInfo{"IQ1_S", 256, 50};
    case GgmlType::kIQ4_NL: return GgmlTypeInfo{"IQ4_NL", 32, 18};
    case GgmlType::kIQ3_S: return GgmlTypeInfo{"IQ3_S", 256, 110};
    case GgmlType::kIQ2_S: return GgmlTypeInfo{"IQ2_S", 256, 82};
    case GgmlType::kIQ4_XS: return GgmlTypeInfo{"IQ4_XS", 256, 136};
    case GgmlType::kI8: return GgmlTypeInfo{"I8", 1, 1};
    case GgmlType::kI16: return GgmlTypeInfo{"I16", 1, 2};
    case GgmlType::kI32: return GgmlTypeInfo{"I32", 1, 4};
    case GgmlType::kI64: return GgmlTypeInfo{"I64", 1, 8};
    case GgmlType::kF64: return GgmlTypeInfo{"F64", 1, 8};
    case GgmlType::kIQ1_M: return GgmlTypeInfo{"IQ1_M", 256, 56};
    case GgmlType::kBF16: return GgmlTypeInfo{"BF16", 1, 2};
    case GgmlType::kTQ1_0: return GgmlTypeInfo{"TQ1_0", 256, 54};
    case GgmlType::kTQ2_0: return GgmlTypeInfo{"TQ2_0", 256, 66};
    case GgmlType::kMXFP4: return GgmlTypeInfo{"MXFP4", 32, 17};
  }
  return std::nullopt;
}

}  // namespace metro::gguf
