// The sandbox's bounds (Limits) and the meter that enforces them during one render (Budget).
#pragma once

#include <cstddef>
#include <cstdint>

#include "jinja/error.h"

namespace metro::jinja {

// Sandbox bounds. A template that passes one fails with ErrorKind::kLimit, never hangs.
struct Limits {
  // Template text, in bytes (real chat templates are a few KiB; the largest known ~40 KiB).
  size_t max_source_bytes = 1 << 20;
  // Work units: statements, expression evaluations, loop iterations, elements visited by
  // filters, and one unit per 128 bytes of every string the template builds.
  uint64_t max_steps = 1'000'000;
  // Rendered text, and also the largest string or list the template may build.
  size_t max_output_bytes = 8 << 20;
  // Nested evaluation frames (statements, expressions, macro calls) at run time. This also
  // guards the thread's stack: 256 levels fit in 256 KiB of stack in a release build.
  uint32_t max_recursion_depth = 256;
  // Wall-clock budget of one render in milliseconds; 0 disables it. A backstop for the
  // step bound, which is what tests rely on (it is deterministic).
  int64_t max_render_ms = 1000;
};

// Nesting of brackets and blocks the parser accepts; deeper templates are syntax errors.
// Bounds the parser's recursion, independent of the run-time limits above.
inline constexpr uint32_t kMaxParseNesting = 64;

// Counts the work of one render against Limits. Not thread-safe: one per render.
class Budget {
 public:
  explicit Budget(const Limits& limits);

  const Limits& limits() const { return limits_; }
  uint64_t steps() const { return steps_; }

  // Charges n work units; throws ErrorKind::kLimit past max_steps or the deadline.
  void tick(uint64_t n = 1) {
    steps_ += n;
    if (steps_ > limits_.max_steps || steps_ >= next_clock_check_) check_slow();
  }
  // Charges for building a string of n bytes, and refuses strings past max_output_bytes.
  void charge_bytes(size_t n);
  // Refuses a list of n items (it would not fit the output anyway).
  void check_items(size_t n) const;

 private:
  void check_slow();

  Limits limits_;
  uint64_t steps_ = 0;
  uint64_t next_clock_check_ = 0;
  int64_t deadline_ns_ = 0;  // 0: none
};

inline constexpr uint64_t kBytesPerStep = 128;
// Steps between two looks at the clock (a clock read costs ~20 ns; a step a few ns).
inline constexpr uint64_t kStepsPerClockCheck = 4096;

}  // namespace metro::jinja
