// UniqueFd: the one owner of a POSIX file descriptor. Move-only. The
// destructor closes (and can only log a failure); code that wrote through the
// descriptor calls close() explicitly to see close's error, because close and
// fsync can report deferred write errors.
#pragma once

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

}  // namespace strata
