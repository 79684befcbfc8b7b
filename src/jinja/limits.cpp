#include "jinja/limits.h"

#include <string>

#include "base/clock.h"

namespace metro::jinja {

Budget::Budget(const Limits& limits) : limits_(limits) {
  if (limits_.max_render_ms > 0) {
    deadline_ns_ = now_ns() + limits_.max_render_ms * 1'000'000;
    next_clock_check_ = kStepsPerClockCheck;
  } else {
    next_clock_check_ = UINT64_MAX;
  }
}

void Budget::check_slow() {
  if (steps_ > limits_.max_steps) {
    throw Error(ErrorKind::kLimit, "template exceeded its step limit of " +
                                       std::to_string(limits_.max_steps) +
                                       " (loop iterations and expression evaluations)");
  }
  if (deadline_ns_ != 0 && steps_ >= next_clock_check_) {
    next_clock_check_ = steps_ + kStepsPerClockCheck;
    if (now_ns() > deadline_ns_) {
      throw Error(ErrorKind::kLimit, "template exceeded its time limit of " +
                                         std::to_string(limits_.max_render_ms) + " ms");
    }
  }
}

void Budget::charge_bytes(size_t n) {
  if (n > limits_.max_output_bytes) {
    throw Error(ErrorKind::kLimit, "template built a string of " + std::to_string(n) +
                                       " bytes, over the output limit of " +
                                       std::to_string(limits_.max_output_bytes));
  }
  tick(1 + n / kBytesPerStep);
}

void Budget::check_items(size_t n) const {
  if (n > limits_.max_output_bytes) {
    throw Error(ErrorKind::kLimit, "template built a list of " + std::to_string(n) +
                                       " items, over the limit of " +
                                       std::to_string(limits_.max_output_bytes));
  }
}

}  // namespace metro::jinja
