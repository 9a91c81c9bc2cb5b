// gpt::GptOps on the host backend: a whole model's step driven through
// the interface (on a HostDevice stream, blocks recomputed in backward)
// gives the same bits as HostGpt (every activation kept); the workspace takes
// exactly what it says from the device budget, and a budget too small for it
// is an error naming it; bf16 and fp16 storage track the fp32 model.
#include "models/gpt/gpt_ops_factory.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "gpu/device_factory.h"
#include "gpu/host/host_device.h"
#include "models/gpt/host/gpt.h"
#include "tests/models/gpt/gpt_step_util.h"
#include "tests/models/gpt/random_model.h"
#include "tests/test_util.h"
#include "tests/tolerance.h"

namespace strata::gpt {
namespace {

using gpu::HostDevice;
using gpu::Stream;

GptConfig small_config() {
  GptConfig c;
  c.layers = 3, c.hidden = 32, c.heads = 4, c.vocab = 37, c.max_seq = 16;
  return c;
}

std::unique_ptr<HostDevice> host_device(uint64_t capacity) {
  Result<std::unique_ptr<HostDevice>> d = HostDevice::create({.capacity_bytes = capacity});
  EXPECT_TRUE(d) << d.error().to_string();
  return std::move(d).value();
}

TEST(HostGptOps, AStepThroughTheInterfaceGivesHostGptsBits) {
  const GptConfig c = small_config();
  const int64_t B = 2, T = 16, N = B * T;
  std::mt19937 rng(strata::testing::test_seed(91));
  std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(c.vocab - 1));
  std::vector<std::vector<float>> w = testing::random_model(c, rng, 0.2f), g_ref;
  std::vector<int32_t> tokens(N), targets(N);
  for (int64_t i = 0; i < N; ++i) tokens[i] = tok(rng), targets[i] = tok(rng);
  const float dloss = 0.5f;

  const float ref_loss = testing::reference_step(c, B, T, w, tokens, targets, dloss, &g_ref);

  auto dev = host_device(64 << 20);
  Result<std::unique_ptr<GptOps>> ops = make_gpt_ops(*dev, c, DType::kF32);
  ASSERT_TRUE(ops) << ops.error().to_string();
  Result<std::unique_ptr<GptOps::Workspace>> ws = (*ops)->workspace(B, T);
  ASSERT_TRUE(ws) << ws.error().to_string();
  Result<ModelStep> m = allocate_model_step(*dev, **ops, B, T);
  ASSERT_TRUE(m) << m.error().to_string();
  Stream s = *dev->create_stream("compute");
  // Stale gradients: the step must zero them itself.
  for (size_t i = 0; i < w.size(); ++i) {
    ASSERT_TRUE(dev->copy_to_device(s, m->grads[i].data(), w[i].data(), w[i].size() * 4).ok());
  }
  std::vector<const void*> wp;
  for (const auto& v : w) wp.push_back(v.data());
  std::vector<std::vector<uint8_t>> g;
  Result<float> loss = testing::run_model_step(*dev, **ops, s, **ws, *m, wp, tokens, targets, dloss, &g);
  ASSERT_TRUE(loss) << loss.error().to_string();
  EXPECT_EQ(*loss, ref_loss);
  EXPECT_GT(*loss, 0.0f);
  for (size_t i = 0; i < g.size(); ++i) {
    ASSERT_EQ(std::memcmp(g[i].data(), g_ref[i].data(), g[i].size()), 0) << "chunk " << i << " differs";
  }
}

TEST(HostGptOps, TheWorkspaceTakesWhatItSaysAndAShortBudgetIsAnError) {
  const GptConfig c = small_config();
  auto dev = host_device(64 << 20);
  Result<std::unique_ptr<GptOps>> ops = make_gpt_ops(*dev, c, DType::kF32);
  ASSERT_TRUE(ops);
  const uint64_t before = dev->used_bytes();
  const uint64_t says = (*ops)->workspace_bytes(4, 16);
  {
    Result<std::unique_ptr<GptOps::Workspace>> ws = (*ops)->workspace(4, 16);
    ASSERT_TRUE(ws);
    EXPECT_EQ(dev->used_bytes() - before, says) << "what the device charges";
    EXPECT_EQ(says, gpt_ops_workspace(gpu::Backend::kHost, c, DType::kF32, 4, 16).total) << "what the planner counts";
  }
  EXPECT_EQ(dev->used_bytes(), before);

  auto small = host_device(says / 2);
  Result<std::unique_ptr<GptOps>> small_ops = make_gpt_ops(*small, c, DType::kF32);
  ASSERT_TRUE(small_ops);
  Result<std::unique_ptr<GptOps::Workspace>> none = (*small_ops)->workspace(4, 16);
  ASSERT_FALSE(none);
  EXPECT_EQ(none.error().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(none.error().message().find("model ops workspace"), std::string::npos) << none.error().to_string();
  EXPECT_EQ((*ops)->workspace(1, 17).error().code(), StatusCode::kInvalidArgument) << "T beyond max_seq";
}

// bf16 / fp16 storage on the host: the same step, rounded at every call's
// edges, against HostGpt in fp32 on the same rounded weights — the loss and
// every chunk's gradient within 1e-2 relative, every element finite.
class HostGptOpsLowPrecision : public ::testing::TestWithParam<DType> {};

TEST_P(HostGptOpsLowPrecision, AStepTracksTheFp32Model) {
  const DType dt = GetParam();
  const GptConfig c = small_config();
  const int64_t B = 2, T = 16, N = B * T;
  std::mt19937 rng(strata::testing::test_seed(92));
  std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(c.vocab - 1));
  std::vector<std::vector<float>> w = testing::random_model(c, rng, 0.2f), g_ref;
  std::vector<std::vector<uint16_t>> w16;
  for (auto& v : w) {
    std::vector<uint16_t> h(v.size());
    for (size_t i = 0; i < v.size(); ++i) {
      h[i] = dt == DType::kBF16 ? f32_to_bf16(v[i]) : f32_to_f16(v[i]);
      v[i] = dt == DType::kBF16 ? bf16_to_f32(h[i]) : f16_to_f32(h[i]);
    }
    w16.push_back(std::move(h));
  }
  std::vector<int32_t> tokens(N), targets(N);
  for (int64_t i = 0; i < N; ++i) tokens[i] = tok(rng), targets[i] = tok(rng);
  const float ref_loss = testing::reference_step(c, B, T, w, tokens, targets, 0.5f, &g_ref);

  auto dev = host_device(64 << 20);
  Result<std::unique_ptr<GptOps>> ops = make_gpt_ops(*dev, c, dt);
  ASSERT_TRUE(ops) << ops.error().to_string();
  EXPECT_EQ((*ops)->dtype(), dt);
  Result<std::unique_ptr<GptOps::Workspace>> ws = (*ops)->workspace(B, T);
  ASSERT_TRUE(ws) << ws.error().to_string();
  Result<ModelStep> m = allocate_model_step(*dev, **ops, B, T);
  ASSERT_TRUE(m) << m.error().to_string();
  Stream s = *dev->create_stream("compute");
  std::vector<const void*> wp;
  for (const auto& v : w16) wp.push_back(v.data());
  std::vector<std::vector<uint8_t>> g;
  Result<float> loss = testing::run_model_step(*dev, **ops, s, **ws, *m, wp, tokens, targets, 0.5f, &g);
  ASSERT_TRUE(loss) << loss.error().to_string();
  EXPECT_NEAR(*loss, ref_loss, strata::testing::kLowPrecisionModelRel * ref_loss);
  for (size_t i = 0; i < g.size(); ++i) {
    EXPECT_LT(testing::relative_error(testing::values_of(g[i], dt), g_ref[i]), strata::testing::kLowPrecisionModelRel) << "chunk " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Types, HostGptOpsLowPrecision, ::testing::Values(DType::kBF16, DType::kF16),
                         [](const ::testing::TestParamInfo<DType>& i) { return std::string(dtype_name(i.param)); });

TEST(HostGptOps, RefusesABadConfig) {
  auto dev = host_device(1 << 20);
  GptConfig bad = small_config();
  bad.heads = 5;
  EXPECT_EQ(make_gpt_ops(*dev, bad, DType::kF32).error().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace strata::gpt
