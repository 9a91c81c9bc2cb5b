// make_device's CUDA side in a build without CUDA: Unimplemented, saying so.
#include <memory>

#include "gpu/device.h"

namespace strata::gpu {

namespace {
Status no_cuda() {
  return unimplemented(
      "this build has no CUDA (the cuda backend needs nvcc at build time: STRATA_CUDA=ON); run on the host backend "
      "(device \"host\")");
}
}  // namespace

Result<std::unique_ptr<Device>> make_cuda_device(uint64_t) { return no_cuda(); }
Result<void*> cuda_allocate_pinned_host(uint64_t) { return no_cuda(); }
void cuda_free_pinned_host(void*) {}

}  // namespace strata::gpu
