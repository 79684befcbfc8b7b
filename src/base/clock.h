// Monotonic clocks and a stopwatch.
#pragma once

#include <chrono>
#include <cstdint>

namespace metro {

inline int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

inline double now_seconds() { return static_cast<double>(now_ns()) * 1e-9; }

// Wall-clock seconds since the Unix epoch (for API `created` fields).
inline int64_t unix_time_seconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

class Stopwatch {
 public:
  Stopwatch() : start_(now_ns()) {}
  void reset() { start_ = now_ns(); }
  int64_t elapsed_ns() const { return now_ns() - start_; }
  double elapsed_ms() const { return static_cast<double>(elapsed_ns()) * 1e-6; }
  double elapsed_s() const { return static_cast<double>(elapsed_ns()) * 1e-9; }

 private:
  int64_t start_;
};

}  // namespace metro
