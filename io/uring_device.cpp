#include "io/uring_device.h"

#include <liburing.h>
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <string>

#include "common/log.h"

namespace strata::io {
namespace {
// user_data of the cancel-all SQE; never a request tag (those are < 2^32).
constexpr uint64_t kCancelTag = ~0ull;
}  // namespace

UringDevice::UringDevice(const UringOptions& options) : options_(options), ring_(std::make_unique<io_uring>()) {}

Result<std::unique_ptr<UringDevice>> UringDevice::create(const UringOptions& options) {
  if (options.queue_depth == 0 || options.queue_depth > 32768) {
    return invalid_argument("io_uring queue depth " + std::to_string(options.queue_depth) + " not in 1..32768");
  }
  std::unique_ptr<UringDevice> dev(new UringDevice(options));
  io_uring_params params{};
  // CQ twice the SQ so completions never overflow while we batch.
  params.flags = IORING_SETUP_CQSIZE;
  params.cq_entries = options.queue_depth * 2;
  int rc = io_uring_queue_init_params(options.queue_depth, dev->ring_.get(), &params);
  if (rc < 0) return errno_status(-rc, "io_uring_queue_init(depth " + std::to_string(options.queue_depth) + ")");
  dev->ring_ready_ = true;

  dev->files_.assign(options.max_files, -1);
  dev->fixed_files_ = io_uring_register_files_sparse(dev->ring_.get(), options.max_files) == 0;
  dev->buffers_.resize(options.max_buffers);
  dev->fixed_buffers_ = io_uring_register_buffers_sparse(dev->ring_.get(), options.max_buffers) == 0;
  return dev;
}

UringDevice::~UringDevice() {
  if (!ring_ready_) return;
  cancel_and_drain();
  if (fixed_buffers_) io_uring_unregister_buffers(ring_.get());
  if (fixed_files_) io_uring_unregister_files(ring_.get());
  io_uring_queue_exit(ring_.get());
}

void UringDevice::cancel_and_drain() {
  if (in_flight_ == 0) return;
  io_uring_sqe* sqe = io_uring_get_sqe(ring_.get());
  bool cancel_pending = false;
  if (sqe != nullptr) {
    io_uring_prep_cancel64(sqe, 0, IORING_ASYNC_CANCEL_ANY | IORING_ASYNC_CANCEL_ALL);
    io_uring_sqe_set_data64(sqe, kCancelTag);
    cancel_pending = io_uring_submit(ring_.get()) >= 1;
  }
  if (!submit_queued().ok()) log_warning("io_uring: could not submit queued requests during shutdown");
  while (in_flight_ > 0 || cancel_pending) {
    io_uring_cqe* cqe = nullptr;
    int rc = io_uring_wait_cqe(ring_.get(), &cqe);
    if (rc == -EINTR) continue;
    if (rc < 0) {
      // Nothing else can be done safely; leaking beats freeing live DMA targets.
      STRATA_CHECK_MSG(false, "io_uring_wait_cqe failed during shutdown: %d", rc);
    }
    if (io_uring_cqe_get_data64(cqe) == kCancelTag) {
      cancel_pending = false;
    } else {
      --in_flight_;
    }
    io_uring_cqe_seen(ring_.get(), cqe);
  }
}

Result<int32_t> UringDevice::attach_file(int fd) {
  for (size_t slot = 0; slot < files_.size(); ++slot) {
    if (files_[slot] != -1) continue;
    if (fixed_files_) {
      int rc = io_uring_register_files_update(ring_.get(), static_cast<unsigned>(slot), &fd, 1);
      if (rc < 0) return errno_status(-rc, "io_uring register file");
    }
    files_[slot] = fd;
    return static_cast<int32_t>(slot);
  }
  return resource_exhausted("io_uring: all " + std::to_string(files_.size()) + " file slots in use");
}

Status UringDevice::detach_file(int32_t slot) {
  STRATA_CHECK(slot >= 0 && static_cast<size_t>(slot) < files_.size() && files_[static_cast<size_t>(slot)] != -1);
  if (fixed_files_) {
    int none = -1;
    int rc = io_uring_register_files_update(ring_.get(), static_cast<unsigned>(slot), &none, 1);
    if (rc < 0) return errno_status(-rc, "io_uring unregister file");
  }
  files_[static_cast<size_t>(slot)] = -1;
  return ok_status();
}

Status UringDevice::register_buffer(std::span<std::byte> region) {
  if (!fixed_buffers_) return ok_status();  // hint only
  for (size_t slot = 0; slot < buffers_.size(); ++slot) {
    if (buffers_[slot].data != nullptr) continue;
    iovec iov{region.data(), region.size()};
    __u64 tag = 0;
    int rc = io_uring_register_buffers_update_tag(ring_.get(), static_cast<unsigned>(slot), &iov, &tag, 1);
    // Registration pins pages against RLIMIT_MEMLOCK; failing it only costs speed.
    if (rc < 0) return ok_status();
    buffers_[slot] = {region.data(), region.size()};
    return ok_status();
  }
  return ok_status();
}

Status UringDevice::unregister_buffer(std::span<std::byte> region) {
  for (size_t slot = 0; slot < buffers_.size(); ++slot) {
    if (buffers_[slot].data != region.data()) continue;
    STRATA_CHECK_MSG(in_flight_ == 0, "unregistering a buffer with I/O in flight");
    iovec iov{nullptr, 0};
    __u64 tag = 0;
    int rc = io_uring_register_buffers_update_tag(ring_.get(), static_cast<unsigned>(slot), &iov, &tag, 1);
    buffers_[slot] = {};
    if (rc < 0) return errno_status(-rc, "io_uring unregister buffer");
  }
  return ok_status();
}

int UringDevice::find_buffer(const std::byte* data, uint32_t length) const {
  for (size_t slot = 0; slot < buffers_.size(); ++slot) {
    const BufferSlot& b = buffers_[slot];
    if (b.data != nullptr && data >= b.data && data + length <= b.data + b.length) return static_cast<int>(slot);
  }
  return -1;
}

Status UringDevice::submit(std::span<const RawRequest> requests) {
  if (in_flight_ + requests.size() > options_.queue_depth) {
    return resource_exhausted("io_uring: " + std::to_string(requests.size()) + " requests exceed free queue depth " +
                              std::to_string(options_.queue_depth - in_flight_));
  }
  if (io_uring_sq_space_left(ring_.get()) < requests.size()) {
    return internal_error("io_uring: submission queue full with depth to spare");
  }
  for (const RawRequest& r : requests) {
    STRATA_CHECK(r.file_slot >= 0 && static_cast<size_t>(r.file_slot) < files_.size());
    int fd = files_[static_cast<size_t>(r.file_slot)];
    STRATA_CHECK_MSG(fd != -1, "request on detached file slot %d", r.file_slot);
    STRATA_CHECK(r.tag != kCancelTag);
    io_uring_sqe* sqe = io_uring_get_sqe(ring_.get());
    STRATA_CHECK(sqe != nullptr);  // space was checked above
    int target = fixed_files_ ? r.file_slot : fd;
    int buf_index = find_buffer(r.data, r.length_bytes);
    if (r.op == IoOp::kRead) {
      if (buf_index >= 0) {
        io_uring_prep_read_fixed(sqe, target, r.data, r.length_bytes, r.offset_bytes, buf_index);
      } else {
        io_uring_prep_read(sqe, target, r.data, r.length_bytes, r.offset_bytes);
      }
    } else {
      if (buf_index >= 0) {
        io_uring_prep_write_fixed(sqe, target, r.data, r.length_bytes, r.offset_bytes, buf_index);
      } else {
        io_uring_prep_write(sqe, target, r.data, r.length_bytes, r.offset_bytes);
      }
    }
    if (fixed_files_) sqe->flags |= IOSQE_FIXED_FILE;
    io_uring_sqe_set_data64(sqe, r.tag);
  }
  // Every prepared SQE now belongs to the kernel's queue and will complete
  // with a CQE, so all count as in flight even if the kernel takes them later.
  in_flight_ += static_cast<uint32_t>(requests.size());
  unsubmitted_ += static_cast<uint32_t>(requests.size());
  return submit_queued();
}

Status UringDevice::submit_queued() {
  while (unsubmitted_ > 0) {
    int rc = io_uring_submit(ring_.get());
    if (rc == -EINTR) continue;
    // EAGAIN/EBUSY: the kernel wants completions reaped first; the SQEs stay
    // queued and reap() pushes them again.
    if (rc == -EAGAIN || rc == -EBUSY) return ok_status();
    if (rc < 0) return errno_status(-rc, "io_uring_submit");
    if (rc == 0) return ok_status();
    unsubmitted_ -= std::min<uint32_t>(unsubmitted_, static_cast<uint32_t>(rc));
  }
  return ok_status();
}

Result<size_t> UringDevice::reap(std::span<RawCompletion> out, size_t min_complete) {
  STRATA_RETURN_IF_ERROR(submit_queued());
  size_t want = std::min<size_t>(min_complete, in_flight_);
  want = std::min(want, out.size());
  size_t n = 0;
  while (n < out.size()) {
    io_uring_cqe* cqe = nullptr;
    int rc = 0;
    if (n < want) {
      rc = io_uring_wait_cqe(ring_.get(), &cqe);
      if (rc == -EINTR) continue;
    } else {
      rc = io_uring_peek_cqe(ring_.get(), &cqe);
      if (rc == -EAGAIN) break;
    }
    if (rc < 0) return errno_status(-rc, "io_uring_wait_cqe");
    uint64_t tag = io_uring_cqe_get_data64(cqe);
    int64_t res = cqe->res;
    io_uring_cqe_seen(ring_.get(), cqe);
    if (tag == kCancelTag) continue;
    --in_flight_;
    out[n++] = RawCompletion{tag, res};
  }
  return n;
}

}  // namespace strata::io
