#include "base/log.h"

#include <atomic>
#include <cstdio>
#include <mutex>

namespace metro {
namespace {
// Process-wide configuration, written once at start-up; not mutable state in the hot path.
std::atomic<int> g_level{static_cast<int>(LogLevel::kInfo)};
std::mutex g_log_mutex;
}  // namespace

void set_log_level(LogLevel level) { g_level.store(static_cast<int>(level)); }
LogLevel log_level() { return static_cast<LogLevel>(g_level.load()); }

void log_message(LogLevel level, const char* fmt, ...) {
  if (static_cast<int>(level) < g_level.load(std::memory_order_relaxed)) return;
  static constexpr const char* kTags[] = {"debug", "info", "warn", "error", ""};
  char buf[2048];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  std::lock_guard<std::mutex> lock(g_log_mutex);
  std::fprintf(stderr, "metro %s: %s\n", kTags[static_cast<int>(level)], buf);
}

}  // namespace metro
