// UniqueFd: the one owner of a POSIX file descriptor. Move-only. The
// destructor closes (and can only log a failure); code that wrote through the
// descriptor calls close() explicitly to see close's error, because close and
// fsync can report deferred write errors.
#pragma once

#include <string>

#include "common/status.h"

namespace strata {

class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& other) noexcept : fd_(other.release()) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept;
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd();

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  // Gives up ownership without closing.
  int release() {
    int fd = fd_;
    fd_ = -1;
    return fd;
  }
  // Closes now and reports close()'s error. Idempotent.
  Status close();

 private:
  int fd_ = -1;
};

// Whether files can be created in directory `dir` now: creates and removes a
// probe file there. For outputs written at the end of long work (a
// checkpoint, a trace), so that a wrong path fails before the work, not
// after it. The error keeps the errno (ENOENT, EACCES, EROFS, ENOSPC).
Status check_directory_writable(const std::string& dir);

}  // namespace strata
