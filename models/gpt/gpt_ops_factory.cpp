// make_gpt_ops: the GPT's ops for the kind of device given, and the
// planner's count of their workspace on either backend.
#include "models/gpt/gpt_ops_factory.h"

#include "models/gpt/cuda/workspace.h"
#include "models/gpt/host/gpt.h"
#include "models/gpt/host/gpt_ops.h"
#if STRATA_HAVE_CUDA
#include "models/gpt/cuda/gpt_ops.h"
#endif

namespace strata::gpt {

Result<std::unique_ptr<GptOps>> make_gpt_ops(gpu::Device& device, const GptConfig& config, DType dtype) {
  if (auto* host = dynamic_cast<gpu::HostDevice*>(&device)) return make_host_gpt_ops(*host, config, dtype);
#if STRATA_HAVE_CUDA
  if (auto* gpu = dynamic_cast<gpu::cuda::CudaDevice*>(&device)) return cuda::make_cuda_gpt_ops(*gpu, config, dtype);
#endif
  return unimplemented("the GPT has no ops for a device of kind \"" + std::string(device.name()) + "\"");
}

WorkspaceBytes gpt_ops_workspace(gpu::Backend backend, const GptConfig& config, DType dtype, int64_t batch,
                                 int64_t seq) {
  const auto acts = static_cast<uint64_t>(host::BlockActivations<float>::elements(config, batch, seq));
  if (backend == gpu::Backend::kHost) {
    // fp32 whatever the storage type: the host ops compute in fp32. One
    // allocation (the ops' workspace_bytes).
    return {acts * 4, gpu::device_allocation_bytes(host_gpt_ops_workspace_bytes(config, dtype, batch, seq))};
  }
  // CUDA: one block's buffers and the head's, in the storage type.
  const cuda::CudaWorkspaceBytes b = cuda::cuda_workspace_bytes(config, static_cast<int64_t>(dtype_bytes(dtype)), batch, seq);
  return {b.block, b.total()};
}

}  // namespace strata::gpt
