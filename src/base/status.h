// Status and Expected<T>: the error currency of metro.
//
// Bad input from outside (files, HTTP, CLI) becomes an error value with a message a user can
// act on. Internal invariants use METRO_CHECK (base/check.h) instead.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

#include "base/check.h"

namespace metro {

enum class ErrorCode : uint8_t {
  kOk = 0,
  kInvalidArgument,    // the caller's input is malformed
  kNotFound,           // a named thing does not exist
  kOutOfRange,         // a value is outside what is allowed
  kDataLoss,           // a file is corrupt or truncated
  kUnimplemented,      // a valid input metro does not support
  kResourceExhausted,  // memory, queue or quota full
  kUnavailable,        // try again later (loading, overloaded)
  kIo,                 // the operating system refused
  kInternal,           // a bug
};

std::string_view error_code_name(ErrorCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(ErrorCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status ok_status() { return {}; }

  bool ok() const { return code_ == ErrorCode::kOk; }
  ErrorCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "<code name>: <message>", for logs.
  std::string to_string() const;

 private:
  ErrorCode code_ = ErrorCode::kOk;
  std::string message_;
};

inline Status invalid_argument(std::string m) { return {ErrorCode::kInvalidArgument, std::move(m)}; }
inline Status not_found(std::string m) { return {ErrorCode::kNotFound, std::move(m)}; }
inline Status out_of_range(std::string m) { return {ErrorCode::kOutOfRange, std::move(m)}; }
inline Status data_loss(std::string m) { return {ErrorCode::kDataLoss, std::move(m)}; }
inline Status unimplemented(std::string m) { return {ErrorCode::kUnimplemented, std::move(m)}; }
inline Status resource_exhausted(std::string m) { return {ErrorCode::kResourceExhausted, std::move(m)}; }
inline Status unavailable(std::string m) { return {ErrorCode::kUnavailable, std::move(m)}; }
inline Status io_error(std::string m) { return {ErrorCode::kIo, std::move(m)}; }
inline Status internal_error(std::string m) { return {ErrorCode::kInternal, std::move(m)}; }

// A value or an error Status. Constructing from a Status that is ok() is a bug.
template <class T>
class [[nodiscard]] Expected {
 public:
  Expected(T value) : v_(std::in_place_index<0>, std::move(value)) {}  // NOLINT implicit
  Expected(Status error) : v_(std::in_place_index<1>, std::move(error)) {  // NOLINT implicit
    METRO_CHECK(!std::get<1>(v_).ok());
  }

  bool ok() const { return v_.index() == 0; }
  explicit operator bool() const { return ok(); }

  T& value() & {
    METRO_CHECK(ok());
    return std::get<0>(v_);
  }
  const T& value() const& {
    METRO_CHECK(ok());
    return std::get<0>(v_);
  }
  T&& value() && {
    METRO_CHECK(ok());
    return std::get<0>(std::move(v_));
  }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T&& operator*() && { return std::move(*this).value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

  const Status& status() const {
    static const Status kOkStatus;
    return ok() ? kOkStatus : std::get<1>(v_);
  }
  Status take_status() && { return ok() ? Status() : std::get<1>(std::move(v_)); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace metro

#define METRO_CONCAT_INNER(a, b) a##b
#define METRO_CONCAT(a, b) METRO_CONCAT_INNER(a, b)

// Returns the Status from the enclosing function when `expr` (a Status) is an error.
#define METRO_RETURN_IF_ERROR(expr)                  \
  do {                                               \
    ::metro::Status metro_status_ = (expr);          \
    if (!metro_status_.ok()) return metro_status_;   \
  } while (0)

// `METRO_ASSIGN_OR_RETURN(auto x, f());` declares x from an Expected or returns its error.
#define METRO_ASSIGN_OR_RETURN(lhs, expr) \
  METRO_ASSIGN_OR_RETURN_IMPL(METRO_CONCAT(metro_expected_, __LINE__), lhs, expr)
#define METRO_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr)           \
  auto tmp = (expr);                                          \
  if (!tmp.ok()) return std::move(tmp).take_status();         \
  lhs = std::move(tmp).value()
