// Which backends this machine runs.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "backends/backend.h"
#include "base/status.h"

namespace metro::backends {

// The backend a model runs on when it is given none: the CPU backend with the widest
// kernel set this CPU runs.
std::shared_ptr<Backend> default_backend();

// Every backend this machine can run, each a fresh instance: the CPU backend with each
// kernel set the CPU runs (the scalar one first), then device backends where present (the
// CUDA backend when the build has it and a CUDA device answers at run time).
// Tests run every op on each of them (tests/backends/backend_ops_test.cpp).
std::vector<std::shared_ptr<Backend>> available_backends();

// The backend a `--device` flag names: "cpu" (the default backend) or "cuda" (the first
// CUDA device; "cuda:N" for device N). Unknown names, and "cuda" where this build or
// machine has no CUDA device, are errors that say so.
Expected<std::shared_ptr<Backend>> make_backend(std::string_view device);

// The device names make_backend accepts, for help texts: "cpu|cuda".
std::string device_names();

}  // namespace metro::backends
