#include "models/gpt/cuda/workspace.h"

#include "gpu/cuda/crossentropy_workspace.h"
#include "gpu/device.h"

namespace strata::gpt::cuda {

// Each allocation as the device charges it (gpu::device_allocation_bytes),
// in the order cuda/block.cpp and cuda/gpt_ops.cpp make them.
CudaWorkspaceBytes cuda_workspace_bytes(const GptConfig& config, int64_t elem_bytes, int64_t batch, int64_t seq) {
  using gpu::device_allocation_bytes;
  using gpu::cuda::crossentropy_workspace_floats;
  const auto N = static_cast<uint64_t>(batch * seq), C = static_cast<uint64_t>(config.hidden);
  const auto e = static_cast<uint64_t>(elem_bytes), rows = static_cast<uint64_t>(batch * config.heads * seq);
  const uint64_t nc = N * C * e, row_stats = device_allocation_bytes(N * 4);
  CudaWorkspaceBytes b;
  // BlockBuffers' [N, k C] tensors (k = 1, 3 or 4): 31 N C in all.
  for (const uint64_t k : {1, 3, 1, 1, 1, 4, 4, 1, 1, 4, 4, 1, 1, 3, 1}) b.block += device_allocation_bytes(k * nc);
  b.block += 4 * row_stats + 2 * device_allocation_bytes(rows * 4);  // LayerNorm statistics; attention row terms
  b.head = 2 * device_allocation_bytes(nc) + 3 * row_stats +
           device_allocation_bytes(static_cast<uint64_t>(crossentropy_workspace_floats(batch * seq)) * 4);
  return b;
}

}  // namespace strata::gpt::cuda
