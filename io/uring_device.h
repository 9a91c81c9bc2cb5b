// UringDevice: BlockDevice on one io_uring instance (liburing).
//
// Owns the ring (held by unique_ptr so its address never changes), a sparse
// table of registered (fixed) files and one of registered buffers. Requests
// whose buffer lies inside a registered region use READ_FIXED/WRITE_FIXED.
// Submission is batched: one io_uring_submit per submit() call.
// The destructor cancels everything in flight and reaps every CQE before the
// ring exits, because a buffer is a DMA target until its CQE is reaped.
#pragma once

#include <memory>
#include <vector>

#include "io/block_device.h"

struct io_uring;

namespace strata::io {

struct UringOptions {
  uint32_t queue_depth = 64;
  uint32_t max_files = 64;
  uint32_t max_buffers = 64;
};

class UringDevice final : public BlockDevice {
 public:
  // Unavailable when the kernel or a seccomp policy refuses io_uring.
  static Result<std::unique_ptr<UringDevice>> create(const UringOptions& options);
  ~UringDevice() override;

  std::string_view name() const override { return "io_uring"; }
  uint32_t queue_depth() const override { return options_.queue_depth; }
  uint32_t in_flight() const override { return in_flight_; }

  Result<int32_t> attach_file(int fd) override;
  Status detach_file(int32_t slot) override;
  Status register_buffer(std::span<std::byte> region) override;
  Status unregister_buffer(std::span<std::byte> region) override;
  Status submit(std::span<const RawRequest> requests) override;
  Result<size_t> reap(std::span<RawCompletion> out, size_t min_complete) override;

  bool fixed_files() const { return fixed_files_; }
  bool fixed_buffers() const { return fixed_buffers_; }

 private:
  explicit UringDevice(const UringOptions& options);
  void cancel_and_drain();
  Status submit_queued();
  int find_buffer(const std::byte* data, uint32_t length) const;

  struct BufferSlot {
    std::byte* data = nullptr;
    uint64_t length = 0;
  };

  UringOptions options_;
  std::unique_ptr<io_uring> ring_;
  bool ring_ready_ = false;
  bool fixed_files_ = false;
  bool fixed_buffers_ = false;
  std::vector<int> files_;              // slot -> fd (-1 free)
  std::vector<BufferSlot> buffers_;     // registered regions (data null = free)
  uint32_t in_flight_ = 0;      // prepared and not yet reaped
  uint32_t unsubmitted_ = 0;    // prepared, not yet taken by the kernel
};

}  // namespace strata::io
