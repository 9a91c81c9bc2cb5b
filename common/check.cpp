// Failure path of STRATA_CHECK: print and abort. Kept out of line so the check
// itself costs one predictable branch.
#include "common/check.h"

#include <cstdarg>
#include <cstdio>
#include <cstdlib>

namespace strata::detail {

void check_failed(const char* file, int line, const char* expr, const char* fmt, ...) {
  std::fprintf(stderr, "strata: CHECK failed at %s:%d: %s", file, line, expr);
  if (fmt != nullptr) {
    std::fputs(": ", stderr);
    va_list args;
    va_start(args, fmt);
    std::vfprintf(stderr, fmt, args);
    va_end(args);
  }
  std::fputc('\n', stderr);
  std::fflush(stderr);
  std::abort();
}

}  // namespace strata::detail
