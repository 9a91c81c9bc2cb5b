#include "io/buffer.h"

#include <sys/mman.h>
#include <sys/resource.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#include <utility>

#include "common/huge_pages.h"
#include "common/units.h"

namespace strata::io {

Buffer::Buffer(std::byte* data, uint64_t capacity_bytes, uint64_t alignment, bool locked, ReleaseFn release,
               void* context)
    : data_(data),
      capacity_bytes_(capacity_bytes),
      alignment_(alignment),
      locked_(locked),
      release_(release),
      context_(context) {}

Buffer::Buffer(Buffer&& other) noexcept { *this = std::move(other); }

Buffer& Buffer::operator=(Buffer&& other) noexcept {
  if (this != &other) {
    reset();
    data_ = std::exchange(other.data_, nullptr);
    capacity_bytes_ = std::exchange(other.capacity_bytes_, 0);
    alignment_ = std::exchange(other.alignment_, 0);
    locked_ = std::exchange(other.locked_, false);
    release_ = std::exchange(other.release_, nullptr);
    context_ = std::exchange(other.context_, nullptr);
  }
  return *this;
}

Buffer::~Buffer() { reset(); }

void Buffer::reset() {
  if (data_ != nullptr && release_ != nullptr) release_(context_, data_, capacity_bytes_);
  data_ = nullptr;
  capacity_bytes_ = 0;
}

namespace {
// Address used only as a non-null "this buffer is mlocked" marker.
int locked_marker = 0;

void release_aligned(void* context, std::byte* data, uint64_t capacity_bytes) {
  bool locked = context != nullptr;
  if (locked) ::munlock(data, capacity_bytes);
  std::free(data);
}
}  // namespace

Result<Buffer> AlignedAllocator::allocate(uint64_t capacity_bytes, uint64_t alignment) {
  if (!is_power_of_two(alignment) || alignment < 64) {
    return invalid_argument("buffer alignment " + std::to_string(alignment) + " is not a power of two >= 64");
  }
  uint64_t rounded = round_up(capacity_bytes == 0 ? alignment : capacity_bytes, alignment);
  void* memory = nullptr;
  int err = ::posix_memalign(&memory, bulk_alignment(rounded, alignment), rounded);
  if (err != 0) return errno_status(err, "allocate " + format_bytes(rounded) + " aligned buffer");
  advise_huge_pages(memory, rounded);  // before the first touch
  std::memset(memory, 0, rounded);
  if (lock_memory_ && ::mlock(memory, rounded) != 0) {
    int lock_err = errno;
    std::free(memory);
    rlimit limit{};
    ::getrlimit(RLIMIT_MEMLOCK, &limit);
    std::string cap = limit.rlim_cur == RLIM_INFINITY ? "unlimited" : format_bytes(limit.rlim_cur);
    return errno_status(lock_err, "mlock " + format_bytes(rounded) + " (RLIMIT_MEMLOCK is " + cap +
                                      "; raise it with `ulimit -l` or turn memory locking off)");
  }
  void* context = lock_memory_ ? &locked_marker : nullptr;
  return Buffer(static_cast<std::byte*>(memory), rounded, alignment, lock_memory_, &release_aligned, context);
}

Result<Buffer> allocate_aligned(uint64_t capacity_bytes, uint64_t alignment) {
  AlignedAllocator allocator(false);
  return allocator.allocate(capacity_bytes, alignment);
}

}  // namespace strata::io
