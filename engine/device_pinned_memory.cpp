#include "engine/device_pinned_memory.h"

#include <string>

#include "common/units.h"

namespace strata::engine {
namespace {

// io::Buffer's release hook: the context is the backend, by value.
void release_pinned(void* context, std::byte* data, uint64_t) {
  gpu::free_pinned_host(static_cast<gpu::Backend>(reinterpret_cast<uintptr_t>(context)), data);
}

}  // namespace

Result<io::Buffer> DevicePinnedMemory::allocate(uint64_t capacity_bytes, uint64_t alignment) {
  if (!is_power_of_two(alignment) || alignment < 64 || alignment > 4096) {
    return invalid_argument("pinned buffer alignment " + std::to_string(alignment) +
                            " is not a power of two in 64..4096");
  }
  const uint64_t rounded = round_up(capacity_bytes == 0 ? alignment : capacity_bytes, alignment);
  STRATA_ASSIGN_OR_RETURN(void* memory, gpu::allocate_pinned_host(backend_, rounded));
  void* context = reinterpret_cast<void*>(static_cast<uintptr_t>(backend_));
  return io::Buffer(static_cast<std::byte*>(memory), rounded, alignment, /*locked=*/true, &release_pinned, context);
}

}  // namespace strata::engine
