// The streamed model's scheduler: the first step records the order in which
// the chunks are used (and fetches each on demand), later steps replay it
// depth uses ahead; a wrong prediction costs waiting, never bits. Every step
// is checked against HostGpt bit for bit.
#include "models/gpt/streamed_model.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <vector>

#include "gpu/host/gpt.h"
#include "gpu/host/host_device.h"
#include "tests/gpu/random_model.h"
#include "tests/test_util.h"

namespace strata::engine {
namespace {

TEST(StreamedModel, RecordsTheOrderOnTheFirstStepAndAMispredictionCostsNoBits) {
  gpu::GptConfig c;
  c.layers = 4, c.hidden = 32, c.heads = 4, c.vocab = 41, c.max_seq = 8;
  const int64_t B = 2, T = 8, N = B * T, L = c.layers;
  std::mt19937 rng(strata::testing::test_seed(93));
  std::vector<std::vector<float>> w = gpu::testing::random_model(c, rng, 0.2f), g, g_ref;
  for (const auto& v : w) g.emplace_back(v.size(), 0.0f);
  std::vector<int32_t> tokens(N), targets(N);
  for (int64_t i = 0; i < N; ++i) {
    tokens[i] = static_cast<int32_t>(rng() % 41);
    targets[i] = static_cast<int32_t>(rng() % 41);
  }
  const float ref_loss = gpu::testing::reference_step(c, B, T, w, tokens, targets, 1.0f, &g_ref);

  Result<std::unique_ptr<gpu::HostDevice>> dev = gpu::HostDevice::create({.capacity_bytes = 8 << 20});
  ASSERT_TRUE(dev);
  Result<std::unique_ptr<StreamedModel>> m = StreamedModel::create(c, B, T, **dev, 2);
  ASSERT_TRUE(m) << m.error().to_string();
  std::vector<const void*> wp;
  std::vector<void*> gp;
  for (auto& v : w) wp.push_back(v.data());
  for (auto& v : g) gp.push_back(v.data());
  auto step_matches = [&](const char* what) {
    Result<float> loss = (*m)->forward_backward(wp, tokens.data(), targets.data(), gp);
    ASSERT_TRUE(loss) << what << ": " << loss.error().to_string();
    EXPECT_EQ(*loss, ref_loss) << what;
    for (size_t i = 0; i < g.size(); ++i) {
      ASSERT_EQ(std::memcmp(g[i].data(), g_ref[i].data(), g[i].size() * 4), 0) << what << ": chunk " << i;
    }
  };

  EXPECT_FALSE((*m)->schedule().replaying());
  step_matches("the recording step");
  // Forward: blocks 1..L, the final chunk; backward: the final chunk, blocks L..1.
  std::vector<size_t> expect;
  for (int64_t l = 1; l <= L; ++l) expect.push_back(static_cast<size_t>(l));
  expect.push_back(static_cast<size_t>(L + 1));
  expect.push_back(static_cast<size_t>(L + 1));
  for (int64_t l = L; l >= 1; --l) expect.push_back(static_cast<size_t>(l));
  EXPECT_EQ((*m)->schedule().order(), expect);
  const uint64_t h2d_before = (*m)->bytes_to_device();
  step_matches("a replayed step");
  EXPECT_EQ((*m)->schedule().deviations(), 0u);
  // With 3 weight slots (depth 2) the last three chunks of forward — blocks
  // L-1 and L and the final chunk — are still in their slots when backward
  // asks for them again (Belady keeps the chunks used again soonest): 10
  // uses, 7 copies.
  EXPECT_EQ((*m)->last_slot_hits(), 3u);
  const std::vector<gpu::ChunkLayout> layout = gpu::model_layout(c);
  auto bytes_of = [&](size_t chunk) { return static_cast<uint64_t>(layout[chunk].numel) * 4; };
  uint64_t copied = bytes_of(0);  // the embedding, resident for the step
  for (size_t chunk : expect) copied += bytes_of(chunk);
  for (int64_t hit = L - 1; hit <= L + 1; ++hit) copied -= bytes_of(static_cast<size_t>(hit));
  EXPECT_EQ((*m)->bytes_to_device() - h2d_before, copied)
      << "every use not served from a slot is one copy (plus the resident embedding)";

  // A schedule that is wrong from its third use on: the prefetched chunks
  // are the wrong ones, are dropped and fetched again.
  std::vector<size_t> wrong = expect;
  std::reverse(wrong.begin() + 2, wrong.end());
  (*m)->schedule().set_order(wrong);
  step_matches("a mispredicted step");
  EXPECT_EQ((*m)->schedule().deviations(), 1u);
  EXPECT_EQ((*m)->schedule().order(), expect) << "the true order is recorded again";
  step_matches("replayed again");
}

}  // namespace
}  // namespace strata::engine
