// Builders for small GGUF files in tests, valid and deliberately broken.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "gguf/writer.h"

namespace metro::testing {

// A small valid v3 file: a few metadata keys of every type and two F32 tensors.
std::vector<uint8_t> small_valid_gguf();

// A raw header: magic, version, tensor count, kv count (no payload).
gguf::Encoder raw_header(uint32_t version, uint64_t n_tensors, uint64_t n_kv);

}  // namespace metro::testing
