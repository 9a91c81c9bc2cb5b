// One transformer block's forward and backward on the GPU, composed from the
// launchers in gpu/cuda/ops.h exactly as host/gpt.cpp composes the host ops, on
// the block's flat parameter chunk (gpt_config.h's block_layout), with the
// fused attention. Storage type T = float, __nv_bfloat16 or __half (fp16
// for V100-class GPUs): parameters, activations and gradients in T, every
// op computing and accumulating in fp32; LayerNorm statistics, the
// attention's log-sum-exp and its backward row terms stay fp32.
#pragma once

#include <cuda_runtime.h>

#include "gpu/cuda/ops.h"
#include "gpu/device.h"
#include "models/gpt/gpt_config.h"

namespace strata::gpt::cuda {

// Device buffers one block needs for B*T rows: what backward keeps from
// forward, and backward's temporaries.
struct BlockBuffers {
  gpu::DeviceMemory ln1, ln1_mean, ln1_rstd, qkv, lse, atty, res2, ln2, ln2_mean, ln2_rstd, fch, fch_gelu, tmp;
  gpu::DeviceMemory dres2, dgelu, dfch, dln2, datty, dqkv, dln1, drow;
};

// elem_bytes: sizeof(T) of the block functions the buffers will serve.
Result<BlockBuffers> allocate_block_buffers(gpu::Device& device, const GptConfig& config, int64_t B, int64_t seq,
                                            int64_t elem_bytes = 4);

template <class T>
Status block_forward(const gpu::cuda::BlasContext& ctx, cudaStream_t s, const GptConfig& config, const T* params, const T* x_in,
                     T* x_out, BlockBuffers& buf, int64_t B, int64_t seq);
// dparams (same layout) += and dx_in += the gradients for dx_out.
template <class T>
Status block_backward(const gpu::cuda::BlasContext& ctx, cudaStream_t s, const GptConfig& config, const T* params, T* dparams,
                      const T* x_in, BlockBuffers& buf, const T* dx_out, T* dx_in, int64_t B, int64_t seq);

}  // namespace strata::gpt::cuda
