// device_info for builds with the CUDA backend: asks the runtime, and turns
// every CUDA error into a Status (never an abort), so a machine without a GPU
// or driver gets a clear reason.
#include <cuda_runtime.h>

#include <cstdio>
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
    char bus_id[32];
    std::snprintf(bus_id, sizeof bus_id, "%04x:%02x:%02x.0", static_cast<unsigned>(prop.pciDomainID),
                  static_cast<unsigned>(prop.pciBusID), static_cast<unsigned>(prop.pciDeviceID));
    devices.push_back({i, prop.name, prop.major, prop.minor, static_cast<uint64_t>(prop.totalGlobalMem), bus_id});
  }
  return devices;
}

}  // namespace strata::gpu
