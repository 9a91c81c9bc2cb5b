#include "common/unique_fd.h"

#include <unistd.h>

#include <cerrno>
#include <string>

#include "common/log.h"

namespace strata {

UniqueFd& UniqueFd::operator=(UniqueFd&& other) noexcept {
  if (this != &other) {
    close().ignore();
    fd_ = other.release();
  }
  return *this;
}

UniqueFd::~UniqueFd() {
  Status status = close();
  if (!status.ok()) log_warning(status.to_string());
}

Status UniqueFd::close() {
  if (fd_ < 0) return ok_status();
  int fd = release();
  // Linux always releases the descriptor, even when close() fails (EINTR
  // included), so it is never retried.
  if (::close(fd) != 0) return errno_status(errno, "close fd " + std::to_string(fd));
  return ok_status();
}

}  // namespace strata
