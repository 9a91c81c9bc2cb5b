// make_device's and the pinned-host calls' CUDA side (gpu/device_factory.h).
#include <cuda_runtime.h>

#include <cstring>
#include <memory>
#include <string>

#include "common/units.h"
#include "gpu/cuda/cuda_device.h"
#include "gpu/device.h"

namespace strata::gpu {

Result<std::unique_ptr<Device>> make_cuda_device(uint64_t capacity_bytes) {
  cuda::CudaDeviceOptions options;
  options.capacity_bytes = capacity_bytes;
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<cuda::CudaDevice> device, cuda::CudaDevice::create(options));
  return Result<std::unique_ptr<Device>>(std::move(device));
}

Result<void*> cuda_allocate_pinned_host(uint64_t bytes) {
  const uint64_t rounded = round_up(bytes == 0 ? 4096 : bytes, uint64_t{4096});
  void* memory = nullptr;
  // Portable: pinned for every device, page-aligned.
  const cudaError_t err = cudaHostAlloc(&memory, rounded, cudaHostAllocPortable);
  if (err != cudaSuccess) {
    return resource_exhausted("cudaHostAlloc of " + format_bytes(rounded) + " pinned host memory: " +
                              cudaGetErrorName(err) + ": " + cudaGetErrorString(err));
  }
  std::memset(memory, 0, rounded);
  return memory;
}

void cuda_free_pinned_host(void* memory) {
  if (memory != nullptr) cudaFreeHost(memory);
}

}  // namespace strata::gpu
