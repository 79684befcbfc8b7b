// The error type of the Jinja lexer, parser and interpreter.
//
// Inside the interpreter an error unwinds a deep recursion (expressions inside statements
// inside macro calls), so it travels as a C++ exception of one private type, jinja::Error.
// Its caller catches it: ChatTemplate::parse/render (tokenizer/chat_template.cpp) return
// it as a Status, so no exception leaves the tokenizer layer.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

namespace metro::jinja {

enum class ErrorKind : uint8_t {
  kSyntax,     // the template text does not parse
  kType,       // an operation on values of the wrong type (Python's TypeError/ValueError)
  kUndefined,  // use of an undefined value where Jinja raises UndefinedError
  kRaised,     // the template called raise_exception(message)
  kLimit,      // a sandbox bound was hit
};

inline constexpr uint32_t kNoOffset = UINT32_MAX;

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const std::string& message, uint32_t offset = kNoOffset)
      : std::runtime_error(message), kind_(kind), offset_(offset) {}
  ErrorKind kind() const { return kind_; }
  // Byte offset into the (newline-normalized) template source, or kNoOffset.
  uint32_t offset() const { return offset_; }

 private:
  ErrorKind kind_;
  uint32_t offset_;
};

[[noreturn]] inline void throw_type_error(const std::string& message) {
  throw Error(ErrorKind::kType, message);
}

}  // namespace metro::jinja
