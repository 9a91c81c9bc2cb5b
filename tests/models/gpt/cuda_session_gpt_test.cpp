// The GPT on the session on a CUDA GPU (the session's slots, pinned staging
// and activation prefetches, the CUDA device's ModelOps): its losses track
// the host backend's, fall, and are the trainer's on the same GPU bit for
// bit (the same kernels in the same order); the vertical order, whose
// embedding gradients go through copy_on_device, gives the one-at-a-time
// order's bits. Needs a GPU; skips with the reason otherwise.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "models/gpt/session_gpt.h"
#include "models/gpt/trainer.h"
#include "tests/models/gpt/trainer_runs.h"
#include "tests/tolerance.h"

namespace strata::engine {
namespace {

gpt::GptConfig model() {
  gpt::GptConfig c;
  c.layers = 3, c.hidden = 64, c.heads = 2, c.vocab = 128, c.max_seq = 32;
  return c;
}

std::vector<float> session_losses(gpu::Backend backend, int grad_accum, int64_t per_pass, int steps) {
  SessionOptions o;
  o.backend = backend;
  o.device_bytes = 16 << 20;
  o.adam.lr = 1e-2f;
  o.prefetch_depth = 2;
  o.resident_first = true;
  o.activations = Tier::kHost;
  o.grad_accum = grad_accum;
  std::vector<float> out;
  Result<std::unique_ptr<Session>> s = Session::create(o);
  EXPECT_TRUE(s.has_value()) << s.status().to_string();
  if (!s.has_value()) return out;
  SessionGptOptions g;
  g.model = model();
  g.batch = 4;
  g.seq = 32;
  g.seed = 5;
  g.offload_activations = true;
  g.micro_batches_per_pass = per_pass;
  Result<std::unique_ptr<SessionGpt>> m = SessionGpt::create(**s, g);
  EXPECT_TRUE(m.has_value()) << m.status().to_string();
  if (!m.has_value()) return out;
  for (int i = 0; i < steps; ++i) {
    Result<float> loss = (*m)->step();
    EXPECT_TRUE(loss.has_value()) << loss.status().to_string();
    if (!loss.has_value()) break;
    out.push_back(*loss);
  }
  EXPECT_TRUE((*s)->finalize().ok());
  return out;
}

// The trainer on the GPU in the same placement: streamed, block inputs on the host.
std::vector<float> trainer_losses(int steps) {
  TrainerOptions o;
  o.model = model();
  o.batch = 4, o.seq = 32, o.seed = 5;
  o.adam.lr = 1e-2f;
  o.stream_weights = true;
  o.device_bytes = 16 << 20;
  o.prefetch_depth = 2;
  o.activations = Tier::kHost;
  o.backend = TrainerOptions::Backend::kCuda;
  return testing::run(o, steps);
}

TEST(CudaSessionGpt, LossesTrackTheHostAndAreTheTrainersOnTheGpu) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    GTEST_SKIP() << "no usable GPU: " << (err != cudaSuccess ? cudaGetErrorString(err) : "no CUDA device");
  }
  const int steps = 15;
  const std::vector<float> host = session_losses(gpu::Backend::kHost, 1, 1, steps);
  const std::vector<float> gpu = session_losses(gpu::Backend::kCuda, 1, 1, steps);
  ASSERT_EQ(host.size(), static_cast<size_t>(steps));
  ASSERT_EQ(gpu.size(), static_cast<size_t>(steps));
  for (int i = 0; i < steps; ++i) {
    EXPECT_NEAR(gpu[i], host[i], strata::testing::kLowPrecisionModelRel * std::fabs(host[i])) << "step " << i + 1;
  }
  EXPECT_LT(gpu.back(), 0.8f * gpu.front());
  EXPECT_EQ(gpu, trainer_losses(steps)) << "the session GPT and the trainer on the same GPU";
  // Two micro-batches a step: the vertical order gives the same bits.
  const std::vector<float> one = session_losses(gpu::Backend::kCuda, 2, 1, 6);
  const std::vector<float> vertical = session_losses(gpu::Backend::kCuda, 2, 0, 6);
  ASSERT_EQ(one.size(), 6u);
  EXPECT_EQ(vertical, one);
}

}  // namespace
}  // namespace strata::engine
