#include "gpu/cuda/workspace.h"

namespace strata::gpu::cuda {

CudaWorkspaceBytes cuda_workspace_bytes(const GptConfig& config, int64_t elem_bytes, int64_t batch, int64_t seq) {
  const auto N = static_cast<uint64_t>(batch * seq), C = static_cast<uint64_t>(config.hidden);
  const auto e = static_cast<uint64_t>(elem_bytes), rows = static_cast<uint64_t>(batch * config.heads * seq);
  CudaWorkspaceBytes b;
  b.block = 31 * N * C * e + 4 * N * 4 + 2 * rows * 4;
  b.head = 2 * N * C * e + 3 * N * 4 + static_cast<uint64_t>(crossentropy_workspace_floats(batch * seq)) * 4;
  return b;
}

}  // namespace strata::gpu::cuda
