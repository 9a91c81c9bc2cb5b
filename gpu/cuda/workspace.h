// The device bytes of the CUDA backend's ModelOps workspace, in plain C++:
// cuda/model_ops.cpp and cuda/block.cpp allocate exactly these, and a
// planner on a machine without CUDA (gpu::model_ops_workspace) counts them
// from here.
#pragma once

#include <cstdint>

#include "gpu/gpt_config.h"

namespace strata::gpu::cuda {

// The fused tied projection + cross-entropy never holds more than
// kCeRows x kCeCols logits at once (cuda/crossentropy.cu).
inline constexpr int64_t kCeRows = 256;
inline constexpr int64_t kCeCols = 4096;
// Its fp32 workspace for N rows: one logits tile and four row terms.
inline int64_t crossentropy_workspace_floats(int64_t N) {
  return kCeRows * kCeCols + 4 * N;
}

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

}  // namespace strata::gpu::cuda
