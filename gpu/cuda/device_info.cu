// device_info for builds with the CUDA backend: asks the runtime, and turns
// every CUDA error into a Status (never an abort), so a machine without a GPU
// or driver gets a clear reason.
#include <cuda_runtime.h>

#include <string>

#include "gpu/device_info.h"

namespace strata::gpu {

bool built_with_cuda() { return true; }

Result<std::vector<CudaDeviceInfo>> cuda_devices() {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    return unavailable(std::string("cudaGetDeviceCount: ") + cudaGetErrorName(err) + ": " + cudaGetErrorString(err));
  }
  std::vector<CudaDeviceInfo> devices;
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp prop{};
    err = cudaGetDeviceProperties(&prop, i);
    if (err != cudaSuccess) {
      return unavailable("cudaGetDeviceProperties(" + std::to_string(i) + "): " + cudaGetErrorString(err));
    }
    devices.push_back({i, prop.name, prop.major, prop.minor, static_cast<uint64_t>(prop.totalGlobalMem)});
  }
  return devices;
}

}  // namespace strata::gpu
