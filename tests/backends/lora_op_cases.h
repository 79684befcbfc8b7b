// Per-op harness cases (backend_ops_test.cpp) of the LoRA op (run-time adapters): each
// token's adapter's B (A x) added to a product's output, against a double-precision
// reference with a bound from its arithmetic.
#pragma once

#include <vector>

#include "backends/backend_test_util.h"

namespace metro::backends::testing {

std::vector<Case> lora_cases();

}  // namespace metro::backends::testing
