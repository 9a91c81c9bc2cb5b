// IoQueue: reliable I/O over any BlockDevice. Every raw completion goes
// through decide_completion() (completion.h): short transfers resubmit the
// remainder, EINTR/EAGAIN/EIO retry within the RetryPolicy, and a final
// failure becomes a Status naming the operation, file, offset and length.
//
// Bounded: at most `max_pending` requests are accepted at once (submitted or
// waiting for device capacity); more is ResourceExhausted, never growth.
// Not thread-safe: one IoQueue per issuing thread, like its device. The
// destructor waits for everything in flight, so no buffer is freed while the
// device may still write into it.
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "io/block_device.h"
#include "io/completion.h"

namespace strata::io {

struct IoRequest {
  IoOp op = IoOp::kRead;
  int32_t file_slot = -1;
  uint64_t offset_bytes = 0;
  std::byte* data = nullptr;
  uint64_t length_bytes = 0;  // 1 .. kMaxRequestBytes
  uint64_t tag = 0;
};

struct IoResult {
  uint64_t tag = 0;
  Status status;
};

struct IoQueueOptions {
  uint32_t max_pending = 4096;
  RetryPolicy retry;
};

class IoQueue {
 public:
  IoQueue(BlockDevice& device, IoQueueOptions options = {});
  IoQueue(const IoQueue&) = delete;
  IoQueue& operator=(const IoQueue&) = delete;
  ~IoQueue();

  BlockDevice& device() { return device_; }

  // `label` (normally the path) names the file in error messages; requests
  // on it must keep `alignment` (1 for buffered files).
  Result<int32_t> attach(int fd, std::string label, uint64_t alignment);
  Status detach(int32_t slot);

  // Accepts a request; its outcome arrives as an IoResult from wait().
  Status submit(const IoRequest& request);

  // Blocks until at least min(min_results, outstanding()) results are ready,
  // then appends every ready result to `out`. Returns how many were appended.
  Result<size_t> wait(size_t min_results, std::vector<IoResult>& out);

  // Requests accepted whose result has not yet been returned by wait().
  size_t outstanding() const { return active_count_ + ready_.size(); }

 private:
  struct Pending {
    IoRequest request;
    RequestProgress progress;
    bool active = false;
  };
  struct FileInfo {
    std::string label;
    uint64_t alignment = 1;
    bool attached = false;
  };

  void pump();
  Status reap_some(size_t min_complete);
  void on_completion(const RawCompletion& completion);
  void finish(uint32_t id, Status status);
  std::string describe(const IoRequest& request) const;

  BlockDevice& device_;
  IoQueueOptions options_;
  std::vector<Pending> pending_;     // fixed size: max_pending
  std::vector<uint32_t> free_ids_;
  std::deque<uint32_t> backlog_;     // accepted, waiting for device capacity
  std::deque<IoResult> ready_;
  std::vector<FileInfo> files_;
  std::vector<RawRequest> batch_;    // reused by pump()
  std::vector<RawCompletion> reaped_;
  size_t active_count_ = 0;          // accepted and not yet finished
};

}  // namespace strata::io
