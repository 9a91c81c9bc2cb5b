#include "gpu/device_factory.h"

#include "gpu/cuda/workspace.h"
#include "gpu/device_info.h"
#include "gpu/host/gpt.h"
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

WorkspaceBytes model_ops_workspace(Backend backend, const GptConfig& config, DType dtype, int64_t batch, int64_t seq) {
  const auto acts = static_cast<uint64_t>(host::BlockActivations<float>::elements(config, batch, seq));
  if (backend == Backend::kHost) {
    // fp32 whatever the storage type: the host ops compute in fp32. One
    // allocation (the ops' workspace_bytes).
    return {acts * 4, device_allocation_bytes(HostDevice::model_ops_workspace_bytes(config, dtype, batch, seq))};
  }
  // CUDA: one block's buffers and the head's, in the storage type.
  const cuda::CudaWorkspaceBytes cuda =
      cuda::cuda_workspace_bytes(config, static_cast<int64_t>(dtype_bytes(dtype)), batch, seq);
  return {cuda.block, cuda.total()};
}

}  // namespace strata::gpu
