// Gradients homed on NVMe (TrainerOptions::gradients): the trainer keeps a
// ring of a few chunk buffers instead of a gradient buffer per chunk, the
// optimizer stage writes each gradient to NVMe as it lands and reads it back
// for an update after the verdict — the same bits as gradients on the host,
// with clipping that fires and fp16 overflows, at any ring size, and with
// accumulation in the vertical order (a ring of fp32 sums); the host holds
// less and NVMe takes 2 more bytes per parameter a step.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "models/gpt/trainer.h"
#include "tests/models/gpt/trainer_runs.h"
#include "tests/test_util.h"
#include "tests/tolerance.h"

namespace strata::engine {
namespace {

// tiny() with 3 blocks and the states on NVMe.
TrainerOptions small(uint64_t seed) {
  TrainerOptions o = testing::tiny(seed);
  o.model.layers = 3;
  o.states = Tier::kNvme;
  return o;
}

using testing::run_log;
using testing::RunLog;

TEST(TrainerGradients, OnNvmeThroughARingTheyGiveTheSameBits) {
  const uint64_t seed = strata::testing::test_seed(20261203);
  strata::testing::TempDir dir;
  int n = 0;
  TrainerOptions free_run = small(seed);
  free_run.nvme_paths = {dir.sub("free")};
  const RunLog free = run_log(free_run, 16);
  ASSERT_EQ(free.norms.size(), 16u);
  std::vector<double> sorted = free.norms;
  std::sort(sorted.begin(), sorted.end());
  // Clipping that fires on some steps (each redone from the old states, with
  // the gradients read back), and fp16 whose loss scale overflows on some
  // (skipped).
  for (bool fp16 : {false, true}) {
    TrainerOptions base = small(seed);
    base.clip_norm = static_cast<float>(sorted[8]);
    if (fp16) {
      base.precision = DType::kF16;
      base.loss_scale.initial_power = 24;
      base.loss_scale.window = 3;
      base.loss_scale.hysteresis = 1;
    }
    base.nvme_paths = {dir.sub("ref" + std::to_string(fp16))};
    const RunLog ref = run_log(base, 16);  // the gradients on the host
    ASSERT_EQ(ref.losses.size(), 16u);
    EXPECT_GT(ref.clipped, 0);
    EXPECT_LT(ref.clipped, 16);
    if (fp16) {
      EXPECT_GT(ref.skipped, 0);
    }
    for (int ring : {1, 3}) {
      for (bool speculate : {true, false}) {
        for (int variant = 0; variant < 3; ++variant) {  // plain; states in pieces; weights streamed from NVMe
          TrainerOptions o = base;
          o.gradients = Tier::kNvme;
          o.gradient_buffers = ring;
          o.speculate = speculate;
          if (variant == 1) o.state_piece_elems = kStatePieceGranule;
          if (variant == 2) {
            o.stream_weights = true;
            o.device_bytes = 8ull << 20;
            o.weights = Tier::kNvme;
            o.prefetch_depth = 2;
          }
          o.nvme_paths = {dir.sub("g" + std::to_string(n++))};
          const std::string what = std::string(fp16 ? "fp16" : "bf16") + ", a ring of " + std::to_string(ring) +
                                   (speculate ? ", speculating" : ", not speculating") +
                                   (variant == 1   ? ", states in pieces"
                                    : variant == 2 ? ", weights on NVMe"
                                                   : "");
          const RunLog got = run_log(o, 16);
          EXPECT_EQ(got.losses, ref.losses) << what;
          EXPECT_EQ(got.norms, ref.norms) << what;
          EXPECT_EQ(got.scales, ref.scales) << what;
          EXPECT_EQ(got.clipped, ref.clipped) << what;
          EXPECT_EQ(got.skipped, ref.skipped) << what;
          // A speculative step that clipped was redone from gradients read back.
          if (speculate) {
            EXPECT_GT(got.rollbacks, 0) << what;
          }
        }
      }
    }
    std::printf(
        "%s: clipping fired on %d of 16 steps, %d skipped; the same bits with the gradients on NVMe "
        "(ring 1 and 3, speculating or not, states in pieces, weights on NVMe)\n",
        fp16 ? "fp16" : "bf16", ref.clipped, ref.skipped);
  }
}

// Accumulating: the vertical order in one pass lands each chunk's
// micro-batches one after another, so a ring of their fp32 sums replaces
// the sums of every chunk; the same bits as the gradients and their sums on
// the host, one micro-batch at a time.
TEST(TrainerGradients, AccumulatedInTheVerticalOrderTheirSumsGoToNvmeWithTheSameBits) {
  const uint64_t seed = strata::testing::test_seed(20261204);
  strata::testing::TempDir dir;
  TrainerOptions base = small(seed);
  base.grad_accum = 4;
  base.batch = 2;
  base.nvme_paths = {dir.sub("free")};
  const RunLog free = run_log(base, 12);
  ASSERT_EQ(free.norms.size(), 12u);
  std::vector<double> sorted = free.norms;
  std::sort(sorted.begin(), sorted.end());
  base.clip_norm = static_cast<float>(sorted[6]);  // fires on some steps
  base.nvme_paths = {dir.sub("ref")};
  const RunLog ref = run_log(base, 12);  // one micro-batch at a time, the sums on the host
  ASSERT_EQ(ref.losses.size(), 12u);
  EXPECT_GT(ref.clipped, 0);
  EXPECT_LT(ref.clipped, 12);
  int n = 0;
  for (int ring : {1, 3}) {
    for (bool speculate : {true, false}) {
      for (Tier acts : {Tier::kDevice, Tier::kHost, Tier::kNvme}) {
        TrainerOptions o = base;
        o.vertical_accumulation = true;
        o.gradients = Tier::kNvme;
        o.gradient_buffers = ring;
        o.speculate = speculate;
        if (acts != Tier::kDevice) {  // streamed, the weights from NVMe, the saved activations off the device
          o.stream_weights = true;
          o.device_bytes = 8ull << 20;
          o.weights = Tier::kNvme;
          o.activations = acts;
          o.state_piece_elems = kStatePieceGranule;
        }
        o.nvme_paths = {dir.sub("v" + std::to_string(n++))};
        const std::string what = "a ring of " + std::to_string(ring) + (speculate ? ", speculating" : "") +
                                 ", activations on " + std::string(tier_name(acts));
        const RunLog got = run_log(o, 12);
        EXPECT_EQ(got.losses, ref.losses) << what;
        EXPECT_EQ(got.norms, ref.norms) << what;
        EXPECT_EQ(got.clipped, ref.clipped) << what;
      }
    }
  }
  // The host holds no sum per chunk: a ring of them (many chunks, so that
  // the rings and the staging buffers' share are smaller).
  TrainerOptions host = base;
  host.model.layers = 24;
  host.vertical_accumulation = true;
  TrainerOptions nvme = host;
  nvme.gradients = Tier::kNvme;
  host.nvme_paths = {dir.sub("hh")};
  nvme.nvme_paths = {dir.sub("hn")};
  const RunLog h = run_log(host, 2), g = run_log(nvme, 2);
  EXPECT_EQ(h.losses, g.losses);
  EXPECT_LT(g.host_bytes, h.host_bytes);
  std::printf(
      "4 micro-batches a step, clipping on %d of 12 steps: the same bits with the fp32 sums on NVMe (rings 1 "
      "and 3, speculating or not, activations on the device, host or NVMe); host %llu -> %llu bytes\n",
      ref.clipped, static_cast<unsigned long long>(h.host_bytes), static_cast<unsigned long long>(g.host_bytes));
}

TEST(TrainerGradients, OnNvmeTheHostHoldsARingAndNvmeTakesTwoBytesAParameter) {
  strata::testing::TempDir dir;
  TrainerOptions host = small(3);
  host.model.layers = 24;  // many chunks, so that a ring of 3 is far smaller
  host.nvme_paths = {dir.sub("h")};
  TrainerOptions nvme = host;
  nvme.gradients = Tier::kNvme;
  nvme.nvme_paths = {dir.sub("n")};
  const RunLog h = run_log(host, 3), g = run_log(nvme, 3);
  ASSERT_EQ(h.losses, g.losses);
  const std::vector<gpt::ChunkLayout> layout = gpt::model_layout(host.model);
  uint64_t grad_bytes = 0, max_chunk = 0;
  for (const gpt::ChunkLayout& c : layout) {
    grad_bytes += 2 * static_cast<uint64_t>(c.numel);
    max_chunk = std::max(max_chunk, 2 * static_cast<uint64_t>(c.numel));
  }
  // The host gives up a buffer per chunk for 3 chunk buffers, and the
  // staging buffers a gradient each (both padded to the swap alignment).
  ASSERT_GT(h.host_bytes, g.host_bytes);
  const uint64_t saved = h.host_bytes - g.host_bytes;
  EXPECT_GE(saved + 1, grad_bytes - 3 * (max_chunk + 4096) - kStateStagingBuffers * (max_chunk + 4096));
  EXPECT_LE(saved, grad_bytes);
  // Each step writes every gradient once (no step clipped: none read back).
  EXPECT_EQ(g.clipped, 0);
  EXPECT_GE(g.nvme_written, h.nvme_written + grad_bytes);
  EXPECT_LE(g.nvme_written, h.nvme_written + grad_bytes + layout.size() * 4096);
  // A host budget of what the run with the gradients on NVMe holds: the
  // gradients on the host are refused by name, on NVMe the model trains.
  host.host_budget_bytes = nvme.host_budget_bytes = g.host_bytes;
  Result<std::unique_ptr<Trainer>> over = Trainer::create(host);
  ASSERT_FALSE(over);
  EXPECT_EQ(over.error().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(over.error().to_string().find("budgets.host"), std::string::npos) << over.error().to_string();
  nvme.nvme_paths = {dir.sub("budget")};
  const RunLog trained = run_log(nvme, 30);
  ASSERT_EQ(trained.losses.size(), 30u);
  // One step's loss on this 24-block model swings by +-0.3 from batch to
  // batch (3.25-4.15 over these 30 steps), so the last one alone says little:
  // the mean of the last ten against the mean of the first five.
  const auto mean = [&](size_t from, size_t count) {
    double sum = 0;
    for (size_t i = from; i < from + count; ++i) sum += trained.losses[i];
    return sum / static_cast<double>(count);
  };
  EXPECT_LT(mean(20, 10), 0.97 * mean(0, 5));
  std::printf("%zu chunks, %llu gradient bytes: the host holds %llu bytes less; NVMe writes %llu bytes more a step\n",
              layout.size(), static_cast<unsigned long long>(grad_bytes), static_cast<unsigned long long>(saved),
              static_cast<unsigned long long>(g.nvme_written - h.nvme_written));
  std::printf(
      "in a host budget of %llu bytes: loss %.4f -> %.4f in 30 steps (means of the first 5 and last 10: "
      "%.4f -> %.4f)\n",
      static_cast<unsigned long long>(g.host_bytes), trained.losses.front(), trained.losses.back(), mean(0, 5),
      mean(20, 10));
}

// The planner sizes the ring as the trainer does, at any number of buffers.
TEST(TrainerGradients, ThePlannedHostBytesFollowTheRingSize) {
  strata::testing::TempDir dir;
  for (int ring : {1, 3, 8}) {
    for (int64_t accum : {1, 2}) {
      TrainerOptions o = small(5);
      o.model.layers = 6;
      o.gradients = Tier::kNvme;
      o.gradient_buffers = ring;
      o.grad_accum = accum;
      o.vertical_accumulation = accum > 1;
      o.nvme_paths = {dir.sub("r" + std::to_string(ring) + "a" + std::to_string(accum))};
      const Plan plan = estimate(training_setup(o), run_placement(o), Bandwidths{});
      Result<std::unique_ptr<Trainer>> tr = Trainer::create(o);
      ASSERT_TRUE(tr) << tr.error().to_string();
      ASSERT_TRUE((*tr)->step());
      EXPECT_NEAR(static_cast<double>(plan.host.total()) / static_cast<double>((*tr)->host_bytes()), 1.0,
                  strata::testing::kPlannedHostBytesRel)
          << "a ring of " << ring << ", grad_accum " << accum;
    }
  }
}

TEST(TrainerGradients, OnNvmeTheyAreRefusedWhereTheTrainerCannotRunThem) {
  strata::testing::TempDir dir;
  auto refused = [&](TrainerOptions o, const std::string& says) {
    o.gradients = Tier::kNvme;
    o.nvme_paths = {dir.path()};
    Result<std::unique_ptr<Trainer>> tr = Trainer::create(o);
    ASSERT_FALSE(tr);
    EXPECT_EQ(tr.error().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(tr.error().to_string().find(says), std::string::npos) << tr.error().to_string();
  };
  TrainerOptions o = small(1);
  o.states = Tier::kHost;
  refused(o, "states on host");
  o = small(1);
  o.grad_accum = 2;
  refused(o, "grad_accum 2 one micro-batch at a time");
  o = small(1);
  o.grad_accum = 4;
  o.vertical_accumulation = true;
  o.vertical_group = 2;
  refused(o, "grad_accum 4 in passes of 2");
  o = small(1);
  o.delayed_update = true;
  refused(o, "the delayed update");
  o = small(1);
  o.gradient_buffers = 0;
  refused(o, "gradient_buffers must be 1..64");
}

}  // namespace
}  // namespace strata::engine
