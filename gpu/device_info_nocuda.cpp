// device_info for builds without the CUDA backend.
#include "gpu/device_info.h"

namespace strata::gpu {

bool built_with_cuda() { return false; }

Result<std::vector<CudaDeviceInfo>> cuda_devices() {
  return unimplemented("strata was built without CUDA (STRATA_CUDA=OFF or no nvcc at configure time)");
}

}  // namespace strata::gpu
