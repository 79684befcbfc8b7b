// Per-op harness cases (backend_ops_test.cpp) of the encoder ops: pos_embed, layer_norm,
// gelu and encoder_attention, each against a double-precision reference with a bound from
// its arithmetic.
#pragma once

#include <vector>

#include "backends/backend_test_util.h"

namespace metro::backends::testing {

std::vector<Case> pos_embed_cases();
std::vector<Case> layer_norm_cases();
std::vector<Case> gelu_cases();
std::vector<Case> encoder_attention_cases();

}  // namespace metro::backends::testing
