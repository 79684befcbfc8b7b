// Renders a parsed template (ast.h) against a dict of variables, inside the sandbox:
// every statement, expression and loop iteration is charged to a Budget (limits.h),
// recursion is bounded, and values are plain data (value.h).
//
// Scoping follows Jinja: each for-loop iteration and each macro call has its own scope;
// `set` inside them does not leak out (use namespace() for that); if-blocks share the
// enclosing scope. Variables resolve through the scope chain, then the render context
// (messages, tools, ...), then the globals (range, namespace, dict, raise_exception,
// strftime_now).
#pragma once

#include <chrono>
#include <functional>
#include <string>

#include "jinja/ast.h"
#include "jinja/limits.h"
#include "jinja/value.h"

namespace metro::jinja {

struct RenderOptions {
  Limits limits;
  // The clock behind strftime_now(format); unset means the system clock.
  std::function<std::chrono::system_clock::time_point()> now;
  // strftime_now formats local time, as Python's datetime.now() does; false: UTC.
  bool local_time = true;
};

// Renders `program` with the entries of `context` (a dict) as template variables. Throws
// jinja::Error, with the offset of the innermost statement or expression being evaluated.
std::string render(const Program& program, const Value& context, const RenderOptions& options);

}  // namespace metro::jinja
