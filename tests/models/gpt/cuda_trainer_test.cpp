// The trainer on a CUDA GPU (the streamed model through the CUDA device's
// ModelOps, pinned staging; resident = a slot for every chunk): its losses
// track the host backend's over the same steps, streamed and resident — both
// keep bf16 weights, activations and gradients, rounded at the same points
// (block edges), and differ by the rounding inside the blocks only — and
// fall; the vertical order of accumulation gives the one-at-a-time order's
// bits. Needs a GPU; skips with the reason otherwise. A build without CUDA
// refuses the backend with a clear error (tested in trainer_test).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "models/gpt/trainer.h"
#include "tests/tolerance.h"

namespace strata::engine {
namespace {

std::vector<float> losses(TrainerOptions o, int steps) {
  std::vector<float> out;
  Result<std::unique_ptr<Trainer>> tr = Trainer::create(o);
  EXPECT_TRUE(tr) << tr.error().to_string();
  if (!tr) return out;
  for (int i = 0; i < steps; ++i) {
    Result<float> loss = (*tr)->step();
    EXPECT_TRUE(loss) << loss.error().to_string();
    if (!loss) break;
    out.push_back(*loss);
  }
  return out;
}

TEST(CudaTrainer, LossesTrackTheHostBackend) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    GTEST_SKIP() << "no usable GPU: " << (err != cudaSuccess ? cudaGetErrorString(err) : "no CUDA device");
  }
  TrainerOptions o;
  o.model.layers = 3, o.model.hidden = 64, o.model.heads = 2, o.model.vocab = 128, o.model.max_seq = 32;
  o.batch = 4, o.seq = 32, o.seed = 5;
  o.adam.lr = 1e-2f;
  o.stream_weights = true;
  o.device_bytes = 16 << 20;
  o.prefetch_depth = 2;
  o.activations = Tier::kHost;
  // `steps` steps on the host backend and on the GPU with the same options:
  // the losses within 1% of each other (bf16 storage: ~0.4% per rounding,
  // which the blocks' internal sums do differently); the GPU's losses returned.
  const int steps = 15;
  auto compare = [&](const char* what) {
    o.backend = TrainerOptions::Backend::kHost;
    const std::vector<float> host = losses(o, steps);
    o.backend = TrainerOptions::Backend::kCuda;
    const std::vector<float> gpu = losses(o, steps);
    EXPECT_EQ(host.size(), static_cast<size_t>(steps)) << what;
    EXPECT_EQ(gpu.size(), static_cast<size_t>(steps)) << what;
    for (size_t i = 0; i < std::min(host.size(), gpu.size()); ++i) {
      EXPECT_NEAR(gpu[i], host[i], strata::testing::kLowPrecisionModelRel * std::fabs(host[i])) << what << " step " << i + 1;
    }
    return gpu;
  };
  const std::vector<float> gpu = compare("streamed");
  ASSERT_FALSE(gpu.empty());
  EXPECT_LT(gpu.back(), 0.8f * gpu.front());
  // Resident: HostGpt on the host, every chunk kept in a slot on the GPU.
  o.stream_weights = false;
  o.activations = Tier::kDevice;
  o.device_bytes = 0;
  compare("resident");
  // Accumulating over two micro-batches, streamed: the vertical order (each
  // block's weights on the GPU once for both) gives the one-at-a-time
  // order's bits on the GPU too (its kernels and GEMMs are deterministic).
  o.stream_weights = true;
  o.device_bytes = 16 << 20;
  o.grad_accum = 2;
  o.backend = TrainerOptions::Backend::kCuda;
  const std::vector<float> one = losses(o, 6);
  o.vertical_accumulation = true;
  const std::vector<float> vertical = losses(o, 6);
  ASSERT_EQ(one.size(), 6u);
  EXPECT_EQ(vertical, one);
}

}  // namespace
}  // namespace strata::engine
