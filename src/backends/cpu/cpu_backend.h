// The CPU backend: weights stay in (or are repacked from) host memory, and a step runs
// inside one ThreadPool::run. See cpu_executor.cpp for how the op sequence is executed.
#pragma once

#include <memory>

#include "backends/backend.h"
#include "kernels/kernel_set.h"

namespace metro::backends {

// A CPU backend running the given kernel set (kernels::active_kernel_set() for the
// fastest this CPU runs; the others are for comparing sets).
std::shared_ptr<Backend> make_cpu_backend(const kernels::KernelSet& set);

}  // namespace metro::backends
