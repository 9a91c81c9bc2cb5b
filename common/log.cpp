#include "common/log.h"

#include <unistd.h>

#include <string>

namespace strata {
namespace {
void write_line(std::string_view level, std::string_view message) {
  std::string line = "strata: ";
  line += level;
  line += message;
  line += '\n';
  // One write() so concurrent lines do not interleave; a failed write to
  // stderr has nowhere else to go.
  ssize_t ignored = ::write(STDERR_FILENO, line.data(), line.size());
  (void)ignored;
}
}  // namespace

void log_notice(std::string_view message) { write_line("", message); }
void log_warning(std::string_view message) { write_line("warning: ", message); }

}  // namespace strata
