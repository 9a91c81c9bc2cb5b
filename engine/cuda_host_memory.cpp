#include "engine/cuda_host_memory.h"

#include <cuda_runtime.h>

#include <cstring>
#include <string>

#include "common/units.h"

namespace strata::engine {
namespace {

void release_pinned(void*, std::byte* data, uint64_t) { cudaFreeHost(data); }

}  // namespace

Result<io::Buffer> CudaPinnedAllocator::allocate(uint64_t capacity_bytes, uint64_t alignment) {
  if (!is_power_of_two(alignment) || alignment < 64 || alignment > 4096) {
    return invalid_argument("pinned buffer alignment " + std::to_string(alignment) +
                            " is not a power of two in 64..4096");
  }
  const uint64_t rounded = round_up(capacity_bytes == 0 ? alignment : capacity_bytes, alignment);
  void* memory = nullptr;
  const cudaError_t err = cudaHostAlloc(&memory, rounded, cudaHostAllocPortable);
  if (err != cudaSuccess) {
    return resource_exhausted("cudaHostAlloc of " + format_bytes(rounded) + " pinned host memory: " +
                              cudaGetErrorName(err) + ": " + cudaGetErrorString(err));
  }
  std::memset(memory, 0, rounded);
  return io::Buffer(static_cast<std::byte*>(memory), rounded, alignment, /*locked=*/true, &release_pinned, nullptr);
}

}  // namespace strata::engine
