#include "base/status.h"

namespace metro {

std::string_view error_code_name(ErrorCode code) {
  switch (code) {
    case ErrorCode::kOk: return "ok";
    case ErrorCode::kInvalidArgument: return "invalid argument";
    case ErrorCode::kNotFound: return "not found";
    case ErrorCode::kOutOfRange: return "out of range";
    case ErrorCode::kDataLoss: return "corrupt data";
    case ErrorCode::kUnimplemented: return "unsupported";
    case ErrorCode::kResourceExhausted: return "resource exhausted";
    case ErrorCode::kUnavailable: return "unavailable";
    case ErrorCode::kIo: return "i/o error";
    case ErrorCode::kInternal: return "internal error";
  }
  return "unknown";
}

std::string Status::to_string() const {
  if (ok()) return "ok";
  std::string s(error_code_name(code_));
  s += ": ";
  s += message_;
  return s;
}

}  // namespace metro
