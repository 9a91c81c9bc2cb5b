// Always-on checks for programmer errors (broken invariants). They print
// file:line, the failed expression and an optional message, then abort.
// Operating errors (I/O failures, bad user input) are never checked this way:
// they are returned as Status values (status.h).
// STRATA_DCHECK is compiled only in debug builds, for expensive checks.
#pragma once

namespace strata::detail {
[[noreturn]] void check_failed(const char* file, int line, const char* expr, const char* fmt, ...)
    __attribute__((format(printf, 4, 5)));
}  // namespace strata::detail

#define STRATA_CHECK(cond)                                                                \
  do {                                                                                    \
    if (__builtin_expect(!(cond), 0)) ::strata::detail::check_failed(__FILE__, __LINE__, #cond, nullptr); \
  } while (0)

// printf-style message: STRATA_CHECK_MSG(n < cap, "n=%zu cap=%zu", n, cap)
#define STRATA_CHECK_MSG(cond, ...)                                                       \
  do {                                                                                    \
    if (__builtin_expect(!(cond), 0))                                                     \
      ::strata::detail::check_failed(__FILE__, __LINE__, #cond, __VA_ARGS__);             \
  } while (0)

#ifdef NDEBUG
#define STRATA_DCHECK(cond) \
  do {                      \
    (void)sizeof(cond);     \
  } while (0)
#else
#define STRATA_DCHECK(cond) STRATA_CHECK(cond)
#endif
