// The device bytes of the GPT's CUDA ops' workspace, in plain C++:
// cuda/gpt_ops.cpp and cuda/block.cpp allocate exactly these, and a
// planner on a machine without CUDA (gpt::gpt_ops_workspace) counts them
// from here.
#pragma once

#include <cstdint>

#include "models/gpt/gpt_config.h"

namespace strata::gpt::cuda {

// Each allocation is counted as the device charges it.
struct CudaWorkspaceBytes {
  // One block's buffers (BlockBuffers): 31 [N, C] tensors in the storage
  // type, kept from forward, scratch and gradients; 4 fp32 LayerNorm
  // statistics per row; the attention's fp32 log-sum-exp and backward row
  // terms per (sequence, head, row).
  uint64_t block = 0;
  // The head: ln_f's output and gradient, its fp32 mean, rstd and the
  // loss's log-sum-exp per row, and the cross-entropy's workspace.
  uint64_t head = 0;
  uint64_t total() const { return block + head; }
};
CudaWorkspaceBytes cuda_workspace_bytes(const GptConfig& config, int64_t elem_bytes, int64_t batch, int64_t seq);

}  // namespace strata::gpt::cuda
