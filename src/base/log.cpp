#include "base/log.h"

#include <atomic>
#include <chrono>
#include <ctime>
#include <cstdio>
#include <mutex>

namespace metro {
namespace {
// Process-wide configuration, written once at start-up; not mutable state in the hot path.
std::atomic<int> g_level{static_cast<int>(LogLevel::kInfo)};
std::atomic<int> g_format{static_cast<int>(LogFormat::kText)};
std::mutex g_log_mutex;
}  // namespace

void set_log_level(LogLevel level) { g_level.store(static_cast<int>(level)); }
LogLevel log_level() { return static_cast<LogLevel>(g_level.load()); }
void set_log_format(LogFormat format) { g_format.store(static_cast<int>(format)); }
LogFormat log_format() { return static_cast<LogFormat>(g_format.load()); }

std::string log_timestamp() {
  const auto now = std::chrono::system_clock::now();
  const std::time_t t = std::chrono::system_clock::to_time_t(now);
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000;
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[96];
  std::snprintf(buf, sizeof(buf), "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday,
                tm.tm_hour, tm.tm_min, tm.tm_sec, static_cast<int>(ms));
  return buf;
}

void log_line(const std::string& line) {
  std::lock_guard<std::mutex> lock(g_log_mutex);
  std::fwrite(line.data(), 1, line.size(), stderr);
  std::fputc('\n', stderr);
}

void log_message(LogLevel level, const char* fmt, ...) {
  if (static_cast<int>(level) < g_level.load(std::memory_order_relaxed)) return;
  static constexpr const char* kTags[] = {"debug", "info", "warn", "error", ""};
  char buf[2048];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  if (log_format() == LogFormat::kJson) {
    std::string line = "{\"ts\":\"" + log_timestamp() + "\",\"level\":\"" + kTags[static_cast<int>(level)] + "\",\"msg\":\"";
    for (const char* p = buf; *p != '\0'; ++p) {
      const auto c = static_cast<unsigned char>(*p);
      if (c == '"' || c == '\\') {
        line += '\\';
        line += static_cast<char>(c);
      } else if (c < 0x20) {
        char esc[8];
        std::snprintf(esc, sizeof(esc), "\\u%04x", c);
        line += esc;
      } else {
        line += static_cast<char>(c);
      }
    }
    line += "\"}";
    log_line(line);
    return;
  }
  std::lock_guard<std::mutex> lock(g_log_mutex);
  std::fprintf(stderr, "metro %s: %s\n", kTags[static_cast<int>(level)], buf);
}

}  // namespace metro
