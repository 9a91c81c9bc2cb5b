#include "gpu/device_factory.h"

#include "gpu/device_info.h"
#include "gpu/host/host_device.h"
#include "gpu/host/ops.h"

namespace strata::gpu {

// The CUDA side (cuda/cuda_factory.cpp, or its stand-in in CPU-only builds).
Result<std::unique_ptr<Device>> make_cuda_device(uint64_t capacity_bytes);
Result<void*> cuda_allocate_pinned_host(uint64_t bytes);
void cuda_free_pinned_host(void* memory);

bool backend_built(Backend backend) { return backend == Backend::kHost || built_with_cuda(); }

Result<std::unique_ptr<Device>> make_device(const DeviceSpec& spec) {
  if (spec.backend == Backend::kCuda) return make_cuda_device(spec.capacity_bytes);
  if (spec.compute_threads > 0) host::set_compute_threads(spec.compute_threads);
  HostDeviceOptions options;
  options.capacity_bytes = spec.capacity_bytes > 0 ? spec.capacity_bytes : HostDeviceOptions::kNoCap;
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<HostDevice> device, HostDevice::create(options));
  if (spec.copy_observer) device->set_copy_observer(spec.copy_observer);
  return Result<std::unique_ptr<Device>>(std::move(device));
}

Result<void*> allocate_pinned_host(Backend backend, uint64_t bytes) {
  if (backend == Backend::kCuda) return cuda_allocate_pinned_host(bytes);
  return unimplemented("the host backend has no pinned memory of its own (its copies are memcpy)");
}

void free_pinned_host(Backend backend, void* memory) {
  if (backend == Backend::kCuda) cuda_free_pinned_host(memory);
}

}  // namespace strata::gpu
