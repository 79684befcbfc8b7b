// Errors as the OpenAI API spells them: an HTTP status and
//   {"error": {"message": ..., "type": ..., "param": ..., "code": ...}}
//
// Messages are written for the client: they name the field and what is allowed, and never
// carry file paths, keys or other secrets (docs/reliability.md 24).
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <variant>

#include "base/check.h"
#include "base/status.h"

namespace metro::server {

struct ApiError {
  int status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;            // the offending field; empty: null
  std::string code;             // machine-readable reason; empty: null
  int retry_after_seconds = 0;  // > 0: sent as Retry-After (429/503)

  // The JSON body (one line, no trailing newline).
  std::string body() const;
};

ApiError bad_request(std::string message, std::string param = {}, std::string code = {});
ApiError not_found_error(std::string message, std::string param = {}, std::string code = {});
// 403: the caller is known but not allowed this (type permission_error).
ApiError forbidden_error(std::string message, std::string param = {}, std::string code = {});
ApiError unavailable_error(std::string message, std::string code, int retry_after_seconds = 1);
// Maps an engine/tokenizer Status: invalid_argument -> 400, out_of_range -> 400
// context_length_exceeded, unavailable / resource_exhausted -> 503, anything else -> 500.
ApiError error_from_status(const Status& s, const std::string& param = {});

// A value or an ApiError.
template <class T>
class ApiResult {
 public:
  ApiResult(T value) : v_(std::in_place_index<0>, std::move(value)) {}         // NOLINT implicit
  ApiResult(ApiError error) : v_(std::in_place_index<1>, std::move(error)) {}  // NOLINT implicit

  bool ok() const { return v_.index() == 0; }
  T& value() {
    METRO_CHECK(ok());
    return std::get<0>(v_);
  }
  const T& value() const {
    METRO_CHECK(ok());
    return std::get<0>(v_);
  }
  T* operator->() { return &value(); }
  T& operator*() { return value(); }
  const ApiError& error() const {
    METRO_CHECK(!ok());
    return std::get<1>(v_);
  }

 private:
  std::variant<T, ApiError> v_;
};

// Reason phrase of a status code ("Bad Request"); "Unknown" for codes metro never sends.
const char* http_reason(int status);

}  // namespace metro::server
