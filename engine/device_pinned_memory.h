// Host memory page-locked by a device's driver (cudaHostAlloc on a GPU,
// through gpu/device_factory.h), for the arenas and staging buffers of a
// trainer on that device: its copies from and to it run asynchronously on
// the copy engines. The host backend's trainer locks ordinary memory
// instead (io::AlignedAllocator).
#pragma once

#include "gpu/device_factory.h"
#include "io/buffer.h"

namespace strata::engine {

class DevicePinnedMemory final : public io::BufferAllocator {
 public:
  explicit DevicePinnedMemory(gpu::Backend backend) : backend_(backend) {}
  // Alignment up to the page (4096), which the driver guarantees.
  Result<io::Buffer> allocate(uint64_t capacity_bytes, uint64_t alignment) override;

 private:
  gpu::Backend backend_;
};

}  // namespace strata::engine
