#include "io/file.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "common/log.h"
#include "common/unique_fd.h"
#include "common/units.h"

namespace strata::io {

uint64_t query_dio_alignment(int fd) {
#ifdef STATX_DIOALIGN
  struct statx stx {};
  if (::statx(fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &stx) == 0 && (stx.stx_mask & STATX_DIOALIGN) != 0) {
    return std::max<uint64_t>(stx.stx_dio_mem_align, stx.stx_dio_offset_align);
  }
#else
  (void)fd;
#endif
  return 0;
}

namespace {
// tmpfs and ramfs live in RAM: newer kernels accept O_DIRECT there, but it
// bypasses nothing, so "direct I/O to NVMe" would silently be RAM.
bool in_ram_filesystem(int fd) {
  struct statfs fs {};
  if (::fstatfs(fd, &fs) != 0) return false;
  return fs.f_type == TMPFS_MAGIC || fs.f_type == RAMFS_MAGIC;
}
}  // namespace

Result<File> File::open(const std::string& path, const FileOptions& options) {
  int flags = O_CLOEXEC | (options.writable ? O_RDWR : O_RDONLY) | (options.create ? O_CREAT : 0);
  File file;
  file.path_ = path;
  if (options.direct != DirectMode::kOff) {
    int fd = ::open(path.c_str(), flags | O_DIRECT, 0644);
    int err = errno;
    if (fd >= 0 && in_ram_filesystem(fd)) {
      ::close(fd);
      fd = -1;
      err = EINVAL;
    }
    if (fd >= 0) {
      file.fd_ = UniqueFd(fd);
      file.direct_ = true;
    } else if (err != EINVAL) {
      return errno_status(err, "open " + path);
    } else if (options.direct == DirectMode::kRequire) {
      return invalid_argument("open " + path +
                              ": the filesystem does not support O_DIRECT (tmpfs, ramfs, or an overlay/FUSE mount); "
                              "put swap files on an ext4/xfs NVMe filesystem, or allow buffered I/O "
                              "(DirectMode prefer or off; strata's config: \"io\": {\"direct\": \"prefer\"})");
    } else {
      log_notice("open " + path + ": O_DIRECT not supported by this filesystem, using buffered I/O");
    }
  }
  if (!file.fd_.valid()) {
    int fd = ::open(path.c_str(), flags, 0644);
    if (fd < 0) return errno_status(errno, "open " + path);
    file.fd_ = UniqueFd(fd);
  }
  uint64_t reported = file.direct_ ? query_dio_alignment(file.fd()) : 0;
  file.alignment_ = std::max<uint64_t>(4096, reported);
  if (!is_power_of_two(file.alignment_)) {
    return internal_error("open " + path + ": direct-I/O alignment " + std::to_string(file.alignment_) +
                          " is not a power of two");
  }
  return file;
}

Status check_directory(const std::string& dir, DirectMode direct) {
  STRATA_RETURN_IF_ERROR(check_directory_writable(dir));
  if (direct != DirectMode::kRequire) return ok_status();
  std::string probe = dir + "/.strata-probe-direct." + std::to_string(::getpid());
  Result<File> f = File::open(probe, FileOptions{.create = true, .writable = true, .direct = direct});
  Status closed = f ? f->close() : std::move(f).error();
  ::unlink(probe.c_str());
  return closed;
}

Status File::allocate(uint64_t offset_bytes, uint64_t length_bytes) {
  if (length_bytes == 0) return ok_status();
  std::string what = "preallocate " + format_bytes(length_bytes) + " at offset " + std::to_string(offset_bytes) +
                     " in " + path_;
  if (::fallocate(fd(), 0, static_cast<off_t>(offset_bytes), static_cast<off_t>(length_bytes)) == 0) {
    return ok_status();
  }
  if (errno != EOPNOTSUPP) return errno_status(errno, what);
  // No fallocate on this filesystem: extend the file instead (sparse, so a
  // full disk shows up later as ENOSPC on write rather than here).
  Result<uint64_t> size = size_bytes();
  if (!size) return std::move(size).error();
  uint64_t end = offset_bytes + length_bytes;
  if (end > *size && ::ftruncate(fd(), static_cast<off_t>(end)) != 0) return errno_status(errno, what);
  return ok_status();
}

Result<uint64_t> File::size_bytes() const {
  struct stat st {};
  if (::fstat(fd(), &st) != 0) return errno_status(errno, "stat " + path_);
  return static_cast<uint64_t>(st.st_size);
}

Status File::sync() {
  if (::fdatasync(fd()) != 0) return errno_status(errno, "fdatasync " + path_);
  return ok_status();
}

Status File::close() {
  if (!fd_.valid()) return ok_status();
  Status status = sync();
  Status closed = fd_.close();
  if (status.ok()) status = std::move(closed).with_context(path_);
  return status;
}

}  // namespace strata::io
