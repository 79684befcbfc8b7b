// JSON helpers for the HTTP API: a writer that never throws on bad UTF-8, and typed field
// readers that turn a wrong type or range into an ApiError naming the field.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "server/api_error.h"

namespace metro::server {

// Responses keep their keys in the order they were written (as OpenAI's do).
using Json = nlohmann::ordered_json;

// One-line JSON; invalid UTF-8 in strings becomes U+FFFD instead of throwing.
std::string dump_json(const Json& j);
std::string dump_json(const nlohmann::json& j);

// Replaces every ill-formed UTF-8 sequence with U+FFFD (one per maximal bad subpart).
std::string sanitize_utf8(std::string_view s);
bool is_valid_utf8(std::string_view s);

// Number formatting safe for NaN and infinities ("NaN", "Infinity", "-Infinity").
std::string format_number(double v);

// Field readers over a request object. Each returns nullopt-with-no-error when the field is
// absent or null, the value when it has the right type and range, or sets *err.
// A JSON integer only (no 2.0): "n must be an integer".
std::optional<int64_t> get_int(const nlohmann::json& obj, const char* key, int64_t lo, int64_t hi,
                               std::optional<ApiError>* err);
// Any JSON number; NaN-safe range check [lo, hi].
std::optional<double> get_number(const nlohmann::json& obj, const char* key, double lo, double hi,
                                 std::optional<ApiError>* err);
std::optional<bool> get_bool(const nlohmann::json& obj, const char* key, std::optional<ApiError>* err);
std::optional<std::string> get_string(const nlohmann::json& obj, const char* key, size_t max_bytes,
                                      std::optional<ApiError>* err);

}  // namespace metro::server
