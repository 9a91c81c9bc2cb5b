#include "common/path_check.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>

#include "common/unique_fd.h"

namespace strata {
namespace {

// "a directory", "a FIFO", ...: what a non-regular file is, for messages.
const char* kind_of(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode) || S_ISBLK(mode)) return "a device";
  return "not a regular file";
}

std::string label(std::string_view what, const std::string& path) { return std::string(what) + " " + path; }

}  // namespace

Status check_input_file(const std::string& path, std::string_view what) {
  if (path.empty()) return invalid_argument(std::string(what) + ": the path is empty");
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return errno_status(errno, label(what, path) + " cannot be read");
  if (!S_ISREG(st.st_mode)) {
    return invalid_argument(label(what, path) + " is " + kind_of(st.st_mode) + ", not a file");
  }
  // O_NONBLOCK: should the path become a FIFO after the stat, open does not wait for a writer.
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));
  if (!fd.valid()) return errno_status(errno, label(what, path) + " cannot be read");
  if (st.st_size == 0) return invalid_argument(label(what, path) + " is empty");
  return ok_status();
}

Result<std::string> read_input_file(const std::string& path, std::string_view what) {
  STRATA_RETURN_IF_ERROR(check_input_file(path, what));
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return errno_status(errno, label(what, path) + " cannot be read");
  std::string text;
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd.get(), buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return errno_status(errno, "read " + label(what, path));
    if (n == 0) break;
    text.append(buf, static_cast<size_t>(n));
  }
  if (text.empty()) return invalid_argument(label(what, path) + " is empty");
  return text;
}

Status check_output_file(const std::string& path, std::string_view what) {
  if (path.empty()) return invalid_argument(std::string(what) + ": the path is empty");
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) {
    return invalid_argument(label(what, path) + " is " + kind_of(st.st_mode) + "; give a file's path");
  }
  const std::string dir = std::filesystem::path(path).parent_path().string();
  return check_output_directory(dir.empty() ? "." : dir, std::string(what) + "'s directory");
}

Status check_output_directory(const std::string& path, std::string_view what) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    return errno_status(errno, label(what, path) + " does not exist or cannot be reached; create it first");
  }
  if (!S_ISDIR(st.st_mode)) return invalid_argument(label(what, path) + " is not a directory");
  return check_directory_writable(path).with_context(what);
}

}  // namespace strata
