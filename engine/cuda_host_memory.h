// Page-locked host memory from the CUDA driver (cudaHostAlloc, portable),
// for the arenas and staging buffers of a trainer on a GPU: copies from and
// to it run asynchronously on the copy engines. Built with CUDA only.
#pragma once

#include "io/buffer.h"

namespace strata::engine {

class CudaPinnedAllocator final : public io::BufferAllocator {
 public:
  // Alignment up to the page (4096), which cudaHostAlloc guarantees.
  Result<io::Buffer> allocate(uint64_t capacity_bytes, uint64_t alignment) override;
};

}  // namespace strata::engine
