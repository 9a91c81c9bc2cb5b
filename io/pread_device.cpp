#include "io/pread_device.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <string>

namespace strata::io {

PreadDevice::PreadDevice(const PreadOptions& options) : options_(options) {}

Result<std::unique_ptr<PreadDevice>> PreadDevice::create(const PreadOptions& options) {
  if (options.queue_depth == 0 || options.threads == 0 || options.threads > 256) {
    return invalid_argument("posix I/O: queue depth must be >= 1 and threads 1..256 (got depth " +
                            std::to_string(options.queue_depth) + ", threads " + std::to_string(options.threads) +
                            ")");
  }
  std::unique_ptr<PreadDevice> dev(new PreadDevice(options));
  dev->workers_.reserve(options.threads);
  for (uint32_t i = 0; i < options.threads; ++i) dev->workers_.emplace_back([d = dev.get()] { d->worker(); });
  return dev;
}

PreadDevice::~PreadDevice() {
  {
    // Requests not yet started are still run: their buffers belong to the
    // caller until a completion says otherwise, and we finish before returning.
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  work_cv_.notify_all();
  for (std::thread& t : workers_) t.join();
}

void PreadDevice::worker() {
  std::unique_lock lock(mu_);
  for (;;) {
    work_cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping and drained
    auto [r, fd] = queue_.front();
    queue_.pop_front();
    lock.unlock();
    ssize_t n = r.op == IoOp::kRead ? ::pread(fd, r.data, r.length_bytes, static_cast<off_t>(r.offset_bytes))
                                    : ::pwrite(fd, r.data, r.length_bytes, static_cast<off_t>(r.offset_bytes));
    int64_t res = n >= 0 ? static_cast<int64_t>(n) : -static_cast<int64_t>(errno);
    lock.lock();
    done_.push_back(RawCompletion{r.tag, res});
    done_cv_.notify_one();
  }
}

Result<int32_t> PreadDevice::attach_file(int fd) {
  for (size_t slot = 0; slot < files_.size(); ++slot) {
    if (files_[slot] == -1) {
      files_[slot] = fd;
      return static_cast<int32_t>(slot);
    }
  }
  files_.push_back(fd);
  return static_cast<int32_t>(files_.size() - 1);
}

Status PreadDevice::detach_file(int32_t slot) {
  STRATA_CHECK(slot >= 0 && static_cast<size_t>(slot) < files_.size() && files_[static_cast<size_t>(slot)] != -1);
  files_[static_cast<size_t>(slot)] = -1;
  return ok_status();
}

Status PreadDevice::submit(std::span<const RawRequest> requests) {
  if (in_flight_ + requests.size() > options_.queue_depth) {
    return resource_exhausted("posix I/O: " + std::to_string(requests.size()) + " requests exceed free queue depth " +
                              std::to_string(options_.queue_depth - in_flight_));
  }
  {
    std::lock_guard lock(mu_);
    for (const RawRequest& r : requests) {
      STRATA_CHECK(r.file_slot >= 0 && static_cast<size_t>(r.file_slot) < files_.size());
      int fd = files_[static_cast<size_t>(r.file_slot)];
      STRATA_CHECK_MSG(fd != -1, "request on detached file slot %d", r.file_slot);
      queue_.emplace_back(r, fd);
    }
  }
  in_flight_ += static_cast<uint32_t>(requests.size());
  if (requests.size() == 1) {
    work_cv_.notify_one();
  } else {
    work_cv_.notify_all();
  }
  return ok_status();
}

Result<size_t> PreadDevice::reap(std::span<RawCompletion> out, size_t min_complete) {
  size_t want = std::min<size_t>({min_complete, in_flight_, out.size()});
  std::unique_lock lock(mu_);
  done_cv_.wait(lock, [&] { return done_.size() >= want; });
  size_t n = 0;
  while (n < out.size() && !done_.empty()) {
    out[n++] = done_.front();
    done_.pop_front();
  }
  in_flight_ -= static_cast<uint32_t>(n);
  return n;
}

}  // namespace strata::io
