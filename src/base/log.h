// Minimal leveled logging to stderr. The level is process-wide configuration set once at
// start (from the CLI); logging itself is thread-safe.
#pragma once

#include <cstdarg>

namespace metro {

enum class LogLevel : int { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3, kOff = 4 };

void set_log_level(LogLevel level);
LogLevel log_level();

// printf-style. Appends a newline.
void log_message(LogLevel level, const char* fmt, ...) __attribute__((format(printf, 2, 3)));

}  // namespace metro

#define METRO_LOG_DEBUG(...) ::metro::log_message(::metro::LogLevel::kDebug, __VA_ARGS__)
#define METRO_LOG_INFO(...) ::metro::log_message(::metro::LogLevel::kInfo, __VA_ARGS__)
#define METRO_LOG_WARN(...) ::metro::log_message(::metro::LogLevel::kWarn, __VA_ARGS__)
#define METRO_LOG_ERROR(...) ::metro::log_message(::metro::LogLevel::kError, __VA_ARGS__)
