#include "base/check.h"

#include <cstdio>
#include <cstdlib>

namespace metro::detail {

[[noreturn]] void check_failed(const char* expr, const char* file, int line, const char* msg) {
  std::fprintf(stderr, "metro: internal check failed: %s at %s:%d%s%s\n", expr, file, line,
               msg ? ": " : "", msg ? msg : "");
  std::fflush(stderr);
  std::abort();
}

}  // namespace metro::detail
