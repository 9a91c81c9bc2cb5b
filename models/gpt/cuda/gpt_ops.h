// The GPT's ops on a CUDA GPU (cuda/gpt_ops.cpp): what make_gpt_ops
// (gpt_ops.h) returns for a gpu::cuda::CudaDevice. Built with CUDA only.
#pragma once

#include <memory>

#include "common/dtype.h"
#include "common/status.h"
#include "gpu/cuda/cuda_device.h"
#include "models/gpt/gpt_config.h"
#include "models/gpt/gpt_ops.h"

namespace strata::gpt::cuda {

// fp32, bf16 or fp16, on the device's streams with a cuBLASLt handle of its own.
Result<std::unique_ptr<GptOps>> make_cuda_gpt_ops(gpu::cuda::CudaDevice& device, const GptConfig& config,
                                                  DType dtype);

}  // namespace strata::gpt::cuda
