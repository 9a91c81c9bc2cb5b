// Host buffers for direct I/O.
//
// IoBuffer is a non-owning view (address + capacity) that every io/ call takes,
// so engine/ can hand in memory that io/ did not allocate — CUDA pinned memory,
// slices of a pinned arena — without io/ depending on CUDA.
// Buffer owns one aligned allocation; how it is released is decided by the
// BufferAllocator that made it (free+munlock here, cudaFreeHost in engine/).
// Size and alignment are fixed at construction.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "common/status.h"

namespace strata::io {

struct IoBuffer {
  std::byte* data = nullptr;
  uint64_t capacity_bytes = 0;

  std::span<std::byte> span() const { return {data, static_cast<size_t>(capacity_bytes)}; }
};

class Buffer {
 public:
  // `release(context, data, capacity)` frees the memory; called once.
  using ReleaseFn = void (*)(void* context, std::byte* data, uint64_t capacity_bytes);

  Buffer() = default;
  Buffer(std::byte* data, uint64_t capacity_bytes, uint64_t alignment, bool locked, ReleaseFn release,
         void* context);
  Buffer(Buffer&& other) noexcept;
  Buffer& operator=(Buffer&& other) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer();

  std::byte* data() const { return data_; }
  uint64_t capacity_bytes() const { return capacity_bytes_; }
  uint64_t alignment() const { return alignment_; }
  bool locked() const { return locked_; }
  IoBuffer view() const { return {data_, capacity_bytes_}; }
  std::span<std::byte> span() const { return view().span(); }

 private:
  void reset();

  std::byte* data_ = nullptr;
  uint64_t capacity_bytes_ = 0;
  uint64_t alignment_ = 0;
  bool locked_ = false;
  ReleaseFn release_ = nullptr;
  void* context_ = nullptr;
};

class BufferAllocator {
 public:
  virtual ~BufferAllocator() = default;
  // `capacity_bytes` is rounded up to `alignment` (a power of two >= 64).
  virtual Result<Buffer> allocate(uint64_t capacity_bytes, uint64_t alignment) = 0;
};

// posix_memalign, zero-filled, optionally mlock()ed; buffers of 2 MiB or
// more on 2 MiB boundaries, advised as huge pages (common/huge_pages.h).
// mlock failure is an error that names RLIMIT_MEMLOCK (`ulimit -l`), never a
// silent unlocked buffer.
class AlignedAllocator final : public BufferAllocator {
 public:
  explicit AlignedAllocator(bool lock_memory = false) : lock_memory_(lock_memory) {}
  Result<Buffer> allocate(uint64_t capacity_bytes, uint64_t alignment) override;

 private:
  bool lock_memory_;
};

// Convenience: an unlocked, zero-filled buffer from AlignedAllocator.
Result<Buffer> allocate_aligned(uint64_t capacity_bytes, uint64_t alignment = 4096);

}  // namespace strata::io
