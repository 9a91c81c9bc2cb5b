// One transformer block's forward and backward on the GPU, composed from the
// launchers in ops.h exactly as gpu/host/gpt.cpp composes the host ops, on
// the block's flat parameter chunk (gpt_config.h's block_layout).
#pragma once

#include <cuda_runtime.h>

#include "gpu/cuda/ops.h"
#include "gpu/device.h"
#include "gpu/gpt_config.h"

namespace strata::gpu::cuda {

// Device buffers one block needs for B*T rows: what backward keeps from
// forward, and backward's temporaries.
struct BlockBuffers {
  DeviceMemory ln1, ln1_mean, ln1_rstd, qkv, att, atty, res2, ln2, ln2_mean, ln2_rstd, fch, fch_gelu, tmp;
  DeviceMemory dres2, dgelu, dfch, dln2, datty, dqkv, dln1, dpre;
};

Result<BlockBuffers> allocate_block_buffers(Device& device, const GptConfig& config, int64_t B, int64_t seq);

Status block_forward(const BlasContext& ctx, cudaStream_t s, const GptConfig& config, const float* params,
                     const float* x_in, float* x_out, BlockBuffers& buf, int64_t B, int64_t seq);
// dparams (same layout) += and dx_in += the gradients for dx_out.
Status block_backward(const BlasContext& ctx, cudaStream_t s, const GptConfig& config, const float* params,
                      float* dparams, const float* x_in, BlockBuffers& buf, const float* dx_out, float* dx_in,
                      int64_t B, int64_t seq);

}  // namespace strata::gpu::cuda
