// File: an open file for (normally) O_DIRECT I/O, owning its descriptor.
//
// Alignment is queried, never assumed: statx(STATX_DIOALIGN) where the kernel
// and filesystem report it, else 4 KiB; the result is max(4096, reported) for
// both memory and offsets. A filesystem that rejects O_DIRECT
// (tmpfs, some FUSE/overlay mounts) is refused with a message that says so,
// unless the caller chose DirectMode::kPrefer/kOff — then the file is opened
// buffered, and the caller is told through direct() == false.
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"
#include "common/unique_fd.h"

namespace strata::io {

enum class DirectMode {
  kRequire,  // O_DIRECT or an error (default: page cache never doubles RAM use)
  kPrefer,   // O_DIRECT if the filesystem supports it, else buffered with a notice
  kOff,      // buffered I/O through the page cache
};

struct FileOptions {
  bool create = true;      // create if missing (never truncates)
  bool writable = true;
  DirectMode direct = DirectMode::kRequire;
};

class File {
 public:
  static Result<File> open(const std::string& path, const FileOptions& options);

  File() = default;
  File(File&&) noexcept = default;
  File& operator=(File&&) noexcept = default;

  int fd() const { return fd_.get(); }
  const std::string& path() const { return path_; }
  bool direct() const { return direct_; }
  // Required alignment of buffer addresses, offsets and lengths (power of two).
  uint64_t alignment() const { return alignment_; }

  // Reserves [offset, offset+length) on disk (fallocate; ftruncate where the
  // filesystem has no fallocate). ENOSPC -> ResourceExhausted naming the file.
  Status allocate(uint64_t offset_bytes, uint64_t length_bytes);
  Result<uint64_t> size_bytes() const;
  Status sync();
  // fsync (if written) and close, reporting either failure.
  Status close();

 private:
  UniqueFd fd_;
  std::string path_;
  bool direct_ = false;
  uint64_t alignment_ = 4096;
};

// The direct-I/O alignment statx reports for `fd`, or 0 when the kernel or
// filesystem does not report one.
uint64_t query_dio_alignment(int fd);

// Whether `dir` can hold swap files opened with `direct`: files can be
// created there (check_directory_writable: a missing path, a read-only mount
// or no permission keeps its errno), and under kRequire a probe file opens
// with O_DIRECT — a filesystem without it (tmpfs) is refused with
// File::open's message. The probe files are removed. Each error names `dir`.
Status check_directory(const std::string& dir, DirectMode direct);

}  // namespace strata::io
