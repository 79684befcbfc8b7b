// Minimal leveled logging to stderr. The level and format are process-wide configuration
// set once at start (from the CLI); logging itself is thread-safe. In the JSON format every
// line is one object: {"ts": RFC 3339 UTC, "level", "msg"} (and, for records, their fields).
#pragma once

#include <cstdarg>
#include <string>

namespace metro {

enum class LogLevel : int { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3, kOff = 4 };

void set_log_level(LogLevel level);
LogLevel log_level();

enum class LogFormat : int { kText = 0, kJson = 1 };
void set_log_format(LogFormat format);
LogFormat log_format();

// The time now as RFC 3339 UTC with milliseconds ("2026-12-05T16:30:00.123Z").
std::string log_timestamp();
// A line written as it is (a JSON record built by the caller), under the log's lock.
void log_line(const std::string& line);

// printf-style. Appends a newline.
void log_message(LogLevel level, const char* fmt, ...) __attribute__((format(printf, 2, 3)));

}  // namespace metro

#define METRO_LOG_DEBUG(...) ::metro::log_message(::metro::LogLevel::kDebug, __VA_ARGS__)
#define METRO_LOG_INFO(...) ::metro::log_message(::metro::LogLevel::kInfo, __VA_ARGS__)
#define METRO_LOG_WARN(...) ::metro::log_message(::metro::LogLevel::kWarn, __VA_ARGS__)
#define METRO_LOG_ERROR(...) ::metro::log_message(::metro::LogLevel::kError, __VA_ARGS__)
