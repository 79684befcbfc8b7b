// Which backends this machine runs.
#pragma once

#include <memory>
#include <vector>

#include "backends/backend.h"

namespace metro::backends {

// The backend a model runs on when it is given none: the CPU backend with the widest
// kernel set this CPU runs.
std::shared_ptr<Backend> default_backend();

// Every backend this machine can run, each a fresh instance: the CPU backend with each
// kernel set the CPU runs (the scalar one first), then device backends where present.
// Tests run every op on each of them (tests/backends/backend_ops_test.cpp).
std::vector<std::shared_ptr<Backend>> available_backends();

}  // namespace metro::backends
