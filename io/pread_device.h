// PreadDevice: BlockDevice on plain pread/pwrite, run by a small pool of
// worker threads. The fallback when io_uring cannot be set up (containers
// often forbid it), selectable by config, and the oracle the io_uring device
// is tested against. Each request is one syscall, so short transfers and
// errors reach IoQueue exactly as io_uring reports them.
#pragma once

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "io/block_device.h"

namespace strata::io {

struct PreadOptions {
  uint32_t queue_depth = 32;
  uint32_t threads = 4;
};

class PreadDevice final : public BlockDevice {
 public:
  static Result<std::unique_ptr<PreadDevice>> create(const PreadOptions& options);
  ~PreadDevice() override;

  std::string_view name() const override { return "posix"; }
  uint32_t queue_depth() const override { return options_.queue_depth; }
  uint32_t in_flight() const override { return in_flight_; }

  Result<int32_t> attach_file(int fd) override;
  Status detach_file(int32_t slot) override;
  Status submit(std::span<const RawRequest> requests) override;
  Result<size_t> reap(std::span<RawCompletion> out, size_t min_complete) override;

 private:
  explicit PreadDevice(const PreadOptions& options);
  void worker();

  PreadOptions options_;
  std::vector<int> files_;  // slot -> fd, -1 free; touched only by the issuing thread
  uint32_t in_flight_ = 0;  // issuing thread only

  std::mutex mu_;
  std::condition_variable work_cv_;
  std::condition_variable done_cv_;
  std::deque<std::pair<RawRequest, int>> queue_;  // request, fd
  std::deque<RawCompletion> done_;
  bool stopping_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace strata::io
