// Checks of a step against the state it runs on, shared by the backends: the ops name
// buffers of the state with widths that match their weights, the step fits the spec, and
// every sequence run's block table covers its positions. A failure is a bug in the model
// that built the ops (METRO_CHECK).
#pragma once

#include <span>

#include "backends/backend.h"

namespace metro::backends {

void validate_step(std::span<const Op> ops, const StepDesc& step, const StateSpec& spec);

}  // namespace metro::backends
