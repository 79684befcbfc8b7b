// METRO_CHECK: cheap invariant checks that stay on in release builds.
// A failed check is a bug in metro, never a reaction to bad input (use Status for that).
#pragma once

namespace metro::detail {
[[noreturn]] void check_failed(const char* expr, const char* file, int line, const char* msg);
}  // namespace metro::detail

#define METRO_CHECK(cond)                                                            \
  do {                                                                               \
    if (__builtin_expect(!(cond), 0))                                                \
      ::metro::detail::check_failed(#cond, __FILE__, __LINE__, nullptr);             \
  } while (0)

#define METRO_CHECK_MSG(cond, msg)                                                   \
  do {                                                                               \
    if (__builtin_expect(!(cond), 0))                                                \
      ::metro::detail::check_failed(#cond, __FILE__, __LINE__, (msg));               \
  } while (0)

#ifdef NDEBUG
#define METRO_DCHECK(cond) \
  do {                     \
  } while (0)
#else
#define METRO_DCHECK(cond) METRO_CHECK(cond)
#endif
