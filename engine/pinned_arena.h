// PinnedArena: one host allocation per budget, carved into fixed-size
// buffers that carry chunks between the tiers (NVMe <-> host <-> device).
// The memory comes from an io::BufferAllocator — locked host memory here,
// cudaHostAlloc'ed memory when the engine runs on a GPU — so the allocation
// happens once, before the first step; the per-step path only leases and
// returns buffers. Running out of buffers is ResourceExhausted naming the
// arena, never growth. Leases are RAII. Thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/status.h"
#include "io/buffer.h"

namespace strata::cpu_optim {
class Executor;
}

namespace strata::engine {

class PinnedArena {
 public:
  class Lease {
   public:
    Lease() = default;
    Lease(Lease&& other) noexcept;
    Lease& operator=(Lease&& other) noexcept;
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    ~Lease();

    bool valid() const { return arena_ != nullptr; }
    io::IoBuffer buffer() const;
    std::byte* data() const { return buffer().data; }
    uint32_t index() const { return index_; }

   private:
    friend class PinnedArena;
    Lease(PinnedArena* arena, uint32_t index) : arena_(arena), index_(index) {}
    void reset();
    PinnedArena* arena_ = nullptr;
    uint32_t index_ = 0;
  };

  // `buffer_bytes` is rounded up to 4096. With `first_touch`, the pages are
  // faulted in (and bound) on that executor's NUMA node before first use.
  static Result<std::unique_ptr<PinnedArena>> create(std::string name, uint64_t buffer_bytes, uint32_t buffers,
                                                     io::BufferAllocator& allocator,
                                                     cpu_optim::Executor* first_touch = nullptr);
  ~PinnedArena();

  // A free buffer; `what` names the requester in the error when none is free.
  Result<Lease> acquire(std::string_view what);

  uint64_t buffer_bytes() const { return buffer_bytes_; }
  uint32_t capacity() const { return static_cast<uint32_t>(in_use_.size()); }
  uint32_t in_use() const;
  uint32_t high_water() const;
  uint64_t total_bytes() const { return memory_.capacity_bytes(); }

 private:
  PinnedArena() = default;
  void release(uint32_t index);

  std::string name_;
  uint64_t buffer_bytes_ = 0;
  io::Buffer memory_;
  mutable std::mutex mu_;
  std::vector<bool> in_use_;
  std::vector<uint32_t> free_;
  uint32_t high_water_ = 0;
};

}  // namespace strata::engine
