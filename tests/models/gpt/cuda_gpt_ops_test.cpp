// The GPT's CUDA ops against its host ops (fp32 and bf16 / fp16 storage):
// one block's forward and backward, and a whole model's step through
// gpt::GptOps against HostGpt, as in tests/gpu/cuda_ops_test.cpp. Needs a
// GPU; skips with the reason otherwise.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "gpu/cuda/cuda_device.h"
#include "gpu/cuda/ops.h"
#include "models/gpt/cuda/block.h"
#include "models/gpt/gpt_ops_factory.h"
#include "models/gpt/host/gpt.h"
#include "tests/gpu/cuda_ops_fixture.h"
#include "tests/models/gpt/gpt_step_util.h"
#include "tests/models/gpt/random_model.h"
#include "tests/tolerance.h"

namespace strata::gpt::cuda {
namespace {

using gpu::Backend;
using gpu::cuda::CudaOps;
using gpu::cuda::CudaOpsLowPrecision;
using gpu::cuda::Vec;

TEST_F(CudaOps, BlockForwardBackwardMatchesHost) {
  GptConfig c;
  c.layers = 1, c.hidden = 64, c.heads = 4, c.vocab = 50, c.max_seq = 40;
  const int64_t B = 2, T = 40, N = B * T, C = c.hidden;
  ChunkLayout layout = block_layout(c, 0);
  Vec params = random(static_cast<size_t>(layout.numel), 0.1f), x = random(N * C), dy = random(N * C);
  for (int64_t i = 0; i < C; ++i) params[block_offsets(c).ln1w + i] += 1.0f, params[block_offsets(c).ln2w + i] += 1.0f;
  Vec y(N * C), dparams(params.size(), 0.0f), dx(N * C, 0.0f);
  host::BlockActivations<float> acts;
  acts.resize(c, B, T);
  host::block_forward(c, params.data(), x.data(), y.data(), acts, B, T);
  host::block_backward(c, params.data(), dparams.data(), x.data(), acts, dy.data(), dx.data(), B, T);
  Result<BlockBuffers> buf = allocate_block_buffers(*dev_, c, B, T);
  ASSERT_TRUE(buf) << buf.error().to_string();
  float *d_p = upload(params), *d_x = upload(x), *d_y = poisoned(N * C), *d_dy = upload(dy);
  float* d_dp = upload(Vec(params.size(), 0.0f));
  float* d_dx = upload(Vec(N * C, 0.0f));
  ASSERT_TRUE(block_forward(blas_, stream_, c, d_p, d_x, d_y, *buf, B, T).ok());
  ASSERT_TRUE(block_backward(blas_, stream_, c, d_p, d_dp, d_x, *buf, d_dy, d_dx, B, T).ok());
  expect_close("block out", d_y, y);
  expect_close("block dx", d_dx, dx);
  expect_close("block dparams", d_dp, dparams);
}

using HalfTypes = ::testing::Types<__nv_bfloat16, __half>;
TYPED_TEST_SUITE(CudaOpsLowPrecision, HalfTypes);

TYPED_TEST(CudaOpsLowPrecision, BlockMatchesTheHostFp32Block) {
  using T = TypeParam;
  GptConfig c;
  c.layers = 1, c.hidden = 64, c.heads = 4, c.vocab = 50, c.max_seq = 40;
  const int64_t B = 2, Tn = 40, N = B * Tn, C = c.hidden;
  const ChunkLayout layout = block_layout(c, 0);
  Vec params = this->random(static_cast<size_t>(layout.numel), 0.1f), x = this->random(N * C),
      dy = this->random(N * C);
  for (int64_t i = 0; i < C; ++i) params[block_offsets(c).ln1w + i] += 1.0f, params[block_offsets(c).ln2w + i] += 1.0f;
  T *d_p = this->upload_rounded(params), *d_x = this->upload_rounded(x), *d_dy = this->upload_rounded(dy);
  Vec y(N * C), dparams(params.size(), 0.0f), dx(N * C, 0.0f);
  host::BlockActivations<float> acts;
  acts.resize(c, B, Tn);
  host::block_forward(c, params.data(), x.data(), y.data(), acts, B, Tn);
  host::block_backward(c, params.data(), dparams.data(), x.data(), acts, dy.data(), dx.data(), B, Tn);
  Result<BlockBuffers> buf = allocate_block_buffers(*this->dev_, c, B, Tn, sizeof(T));
  ASSERT_TRUE(buf) << buf.error().to_string();
  T* d_y = this->poisoned_half(N * C);
  T* d_dp = reinterpret_cast<T*>(this->upload(std::vector<uint16_t>(params.size(), 0)));
  T* d_dx = reinterpret_cast<T*>(this->upload(std::vector<uint16_t>(N * C, 0)));
  ASSERT_TRUE(block_forward(this->blas_, this->stream_, c, d_p, d_x, d_y, *buf, B, Tn).ok());
  ASSERT_TRUE(block_backward(this->blas_, this->stream_, c, d_p, d_dp, d_x, *buf, d_dy, d_dx, B, Tn).ok());
  this->expect_close_half("block out", d_y, y);
  this->expect_close_half("block dx", d_dx, dx);
  this->expect_close_half("block dparams", d_dp, dparams);
}


// A whole model's step through GptOps on the GPU (fp32, bf16, fp16)
// against HostGpt in fp32 on the same (rounded) weights: the loss and every
// chunk's gradient within 1e-5 (fp32) or 1e-2 (bf16/fp16) relative.
class CudaGptOpsTest : public CudaOps, public ::testing::WithParamInterface<DType> {
 protected:
  float rounded(float x) const {
    if (GetParam() == DType::kBF16) return bf16_to_f32(f32_to_bf16(x));
    if (GetParam() == DType::kF16) return f16_to_f32(f32_to_f16(x));
    return x;
  }
};

TEST_P(CudaGptOpsTest, AStepMatchesTheHostModel) {
  const DType dt = GetParam();
  const double tol = dt == DType::kF32 ? strata::testing::kF32ModelRel : strata::testing::kLowPrecisionModelRel;
  GptConfig c;
  c.layers = 2, c.hidden = 64, c.heads = 2, c.vocab = 300, c.max_seq = 40;
  const int64_t B = 2, Tn = 40, N = B * Tn;
  const float dloss = 0.5f;
  std::vector<Vec> w = gpt::testing::random_model(c, rng_, 0.1f), g_ref;
  for (Vec& v : w) {
    for (float& x : v) x = rounded(x);
  }
  std::vector<int32_t> tokens(N), targets(N);
  for (int64_t i = 0; i < N; ++i) {
    tokens[i] = static_cast<int32_t>(rng_() % 300);
    targets[i] = static_cast<int32_t>(rng_() % 300);
  }
  const float ref_loss = gpt::testing::reference_step(c, B, Tn, w, tokens, targets, dloss, &g_ref);

  Result<std::unique_ptr<GptOps>> ops = make_gpt_ops(*dev_, c, dt);
  ASSERT_TRUE(ops) << ops.error().to_string();
  Result<std::unique_ptr<GptOps::Workspace>> ws = (*ops)->workspace(B, Tn);
  ASSERT_TRUE(ws) << ws.error().to_string();
  Result<ModelStep> m = allocate_model_step(*dev_, **ops, B, Tn);
  ASSERT_TRUE(m) << m.error().to_string();
  std::vector<std::vector<uint16_t>> w16(w.size());
  std::vector<const void*> wp;
  for (size_t i = 0; i < w.size(); ++i) {
    for (float x : w[i]) w16[i].push_back(dt == DType::kBF16 ? f32_to_bf16(x) : f32_to_f16(x));
    wp.push_back(dt == DType::kF32 ? static_cast<const void*>(w[i].data()) : w16[i].data());
  }
  std::vector<std::vector<uint8_t>> g;
  Result<float> loss = gpt::testing::run_model_step(*dev_, **ops, handle_, **ws, *m, wp, tokens, targets, dloss, &g);
  ASSERT_TRUE(loss) << loss.error().to_string();
  EXPECT_NEAR(*loss, ref_loss, tol * ref_loss);
  for (size_t i = 0; i < g.size(); ++i) {
    EXPECT_LT(gpt::testing::relative_error(gpt::testing::values_of(g[i], dt), g_ref[i]), tol) << "chunk " << i;
  }
}

// The planner counts the CUDA workspace without a device
// (gpt::gpt_ops_workspace); what the ops allocate is that count, in
// every storage type.
TEST_P(CudaGptOpsTest, TheWorkspaceTakesWhatThePlannerCounts) {
  GptConfig c;
  c.layers = 2, c.hidden = 64, c.heads = 2, c.vocab = 300, c.max_seq = 40;
  Result<std::unique_ptr<GptOps>> ops = make_gpt_ops(*dev_, c, GetParam());
  ASSERT_TRUE(ops) << ops.error().to_string();
  const uint64_t counted = gpt_ops_workspace(gpu::Backend::kCuda, c, GetParam(), 3, 40).total;
  EXPECT_EQ((*ops)->workspace_bytes(3, 40), counted);
  const uint64_t before = dev_->used_bytes();
  Result<std::unique_ptr<GptOps::Workspace>> ws = (*ops)->workspace(3, 40);
  ASSERT_TRUE(ws) << ws.error().to_string();
  EXPECT_EQ(dev_->used_bytes() - before, counted) << "each allocation counted as the device charges it";
}

INSTANTIATE_TEST_SUITE_P(Types, CudaGptOpsTest, ::testing::Values(DType::kF32, DType::kBF16, DType::kF16),
                         [](const ::testing::TestParamInfo<DType>& i) { return std::string(dtype_name(i.param)); });

}  // namespace
}  // namespace strata::gpt::cuda
