// io::BlockDevice: the raw I/O engine interface. engine/ reaches storage only
// through this (and the layers on it), so production (io_uring), fallback
// (pread/pwrite thread pool) and fault-injecting devices are interchangeable.
//
// The interface is deliberately raw, like the kernel's: a request is one
// read or write of at most 2 GiB at an offset of an attached file, and its
// completion is the kernel-style result — bytes transferred, or -errno.
// Decoding results, retrying EINTR/EAGAIN/EIO and resubmitting short
// transfers happen once, above every device, in IoQueue (io_queue.h), so a
// fault injected under it exercises exactly the production decoding.
//
// Contract: the buffer of a submitted request stays valid and untouched until
// its completion has been reaped. A device is used by one thread at a time
// (one device per issuing thread); its destructor cancels and reaps
// everything in flight before any resource goes away.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

#include "common/status.h"

namespace strata::io {

enum class IoOp : uint8_t { kRead, kWrite };

inline std::string_view io_op_name(IoOp op) { return op == IoOp::kRead ? "read" : "write"; }

// Largest single request: io_uring and pread both transfer at most this.
inline constexpr uint64_t kMaxRequestBytes = 1ull << 30;

struct RawRequest {
  IoOp op = IoOp::kRead;
  int32_t file_slot = -1;   // from attach_file()
  uint64_t offset_bytes = 0;
  std::byte* data = nullptr;
  uint32_t length_bytes = 0;
  uint64_t tag = 0;         // returned unchanged in the completion
};

struct RawCompletion {
  uint64_t tag = 0;
  int64_t res = 0;  // >= 0: bytes transferred; < 0: -errno
};

class BlockDevice {
 public:
  virtual ~BlockDevice() = default;

  virtual std::string_view name() const = 0;
  // Most requests in flight at once; submit() beyond it is ResourceExhausted.
  virtual uint32_t queue_depth() const = 0;
  virtual uint32_t in_flight() const = 0;

  // Makes `fd` addressable by requests; the caller keeps owning the fd and
  // must detach it (with nothing in flight on it) before closing it.
  virtual Result<int32_t> attach_file(int fd) = 0;
  virtual Status detach_file(int32_t slot) = 0;

  // Registers a buffer region for zero-setup DMA where the backend supports
  // it (io_uring fixed buffers); requests inside it use it automatically.
  // Backends without registration accept and ignore the hint.
  virtual Status register_buffer(std::span<std::byte> region) {
    (void)region;
    return ok_status();
  }
  virtual Status unregister_buffer(std::span<std::byte> region) {
    (void)region;
    return ok_status();
  }

  // Queues and submits all of `requests`, or none of them (error).
  virtual Status submit(std::span<const RawRequest> requests) = 0;

  // Waits until at least min(min_complete, in_flight()) completions are
  // available, then moves up to out.size() of them into `out`. Returns the
  // number written. min_complete == 0 polls without blocking.
  virtual Result<size_t> reap(std::span<RawCompletion> out, size_t min_complete) = 0;
};

}  // namespace strata::io
