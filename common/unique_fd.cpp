#include "common/unique_fd.h"

#include <fcntl.h>
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

Status check_directory_writable(const std::string& dir) {
  const std::string probe = (dir.empty() ? std::string(".") : dir) + "/.strata-probe." + std::to_string(::getpid());
  UniqueFd fd(::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
  if (!fd.valid()) return errno_status(errno, "cannot create files in " + (dir.empty() ? std::string(".") : dir));
  STRATA_RETURN_IF_ERROR(fd.close());
  if (::unlink(probe.c_str()) != 0) return errno_status(errno, "unlink " + probe);
  return ok_status();
}

}  // namespace strata
