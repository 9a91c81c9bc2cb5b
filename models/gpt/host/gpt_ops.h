// The GPT's ops on the host backend (host/gpt_ops.cpp): what make_gpt_ops
// (gpt_ops.h) returns for a gpu::HostDevice.
#pragma once

#include <cstdint>
#include <memory>

#include "common/dtype.h"
#include "common/status.h"
#include "gpu/host/host_device.h"
#include "models/gpt/gpt_config.h"
#include "models/gpt/gpt_ops.h"

namespace strata::gpt {

// fp32, bf16 or fp16 storage; the host computes in fp32.
Result<std::unique_ptr<GptOps>> make_host_gpt_ops(gpu::HostDevice& device, const GptConfig& config, DType dtype);
// What those ops' workspace(B, seq) takes from the budget, without a device
// (the planner's count): one block's fp32 tensors, the head's rows and
// statistics, and for bf16/fp16 storage the fp32 copies of a chunk's
// parameters and gradient and three [N,C] rows.
uint64_t host_gpt_ops_workspace_bytes(const GptConfig& config, DType dtype, int64_t B, int64_t seq);

}  // namespace strata::gpt
