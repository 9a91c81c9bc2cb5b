// The fused tied projection + cross-entropy's working memory (cuda/
// crossentropy.cu), in plain C++ so a build without CUDA can count it.
#pragma once

#include <cstdint>

namespace strata::gpu::cuda {

// The op never holds more than kCeRows x kCeCols logits at once.
inline constexpr int64_t kCeRows = 256;
inline constexpr int64_t kCeCols = 4096;
// Its fp32 workspace for N rows: one logits tile and four row terms.
inline int64_t crossentropy_workspace_floats(int64_t N) {
  return kCeRows * kCeCols + 4 * N;
}

}  // namespace strata::gpu::cuda
