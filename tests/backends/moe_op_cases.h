// Per-op harness cases (backend_ops_test.cpp) of the mixture-of-experts ops: moe (routing,
// grouped expert products, weighted sums) and gated_add, each against a double-precision
// reference with a bound from its arithmetic.
#pragma once

#include <vector>

#include "backends/backend_test_util.h"

namespace metro::backends::testing {

std::vector<Case> moe_cases();
std::vector<Case> gated_add_cases();

}  // namespace metro::backends::testing
