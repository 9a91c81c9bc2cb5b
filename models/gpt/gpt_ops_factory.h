// The GPT's ops for a device of either kind (host/gpt_ops.h,
// cuda/gpt_ops.h), and the planner's count of their workspace on either
// backend without a device.
#pragma once

#include <cstdint>
#include <memory>

#include "common/dtype.h"
#include "common/status.h"
#include "gpu/device.h"
#include "gpu/device_factory.h"
#include "models/gpt/gpt_config.h"
#include "models/gpt/gpt_ops.h"

namespace strata::gpt {

// The GPT's ops on `device` (the host backend's or a CUDA GPU's) with
// tensors stored in `dtype` (fp32, bf16 or fp16). InvalidArgument for a bad
// config; Unimplemented on a device of another kind.
Result<std::unique_ptr<GptOps>> make_gpt_ops(gpu::Device& device, const GptConfig& config, DType dtype);

// What `backend`'s GptOps workspace holds for micro-batches of batch x seq
// tokens stored in `dtype`: the block's working set (activations) and the
// whole workspace, each allocation counted as the device charges it
// (gpu::device_allocation_bytes). The planner's count of device bytes:
// both backends' ops allocate by it.
struct WorkspaceBytes {
  uint64_t activations = 0;
  uint64_t total = 0;
};
WorkspaceBytes gpt_ops_workspace(gpu::Backend backend, const GptConfig& config, DType dtype, int64_t batch,
                                 int64_t seq);

}  // namespace strata::gpt
