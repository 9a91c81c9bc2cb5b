// Argument checks of the CUDA launchers that refuse a call before anything
// reaches the GPU, so they run (and are tested) on machines without one.
#include <gtest/gtest.h>

#include <string>

#include "gpu/cuda/ops.h"

namespace strata::gpu::cuda {
namespace {

// Shapes the fused attention cannot take are refused before anything runs
// (no GPU needed).
TEST(CudaFlashAttention, RefusesHeadsLargerThanItsTiles) {
  Status s = flash_attention_forward<float>(nullptr, nullptr, nullptr, nullptr, 1, 16, 256, 1);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("head size"), std::string::npos) << s.to_string();
  s = flash_attention_backward<float>(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 1, 16, 96, 5);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << "96 is not divisible by 5";
}

}  // namespace
}  // namespace strata::gpu::cuda
