// Gradient accumulation and the caller's data: micro-batches averaged, one
// at a time or in the vertical order (the same bits, the weights moved
// once per step, activations on any tier); data from the caller stepped on
// and bad data refused with nothing changed.
#include "models/gpt/trainer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "tests/models/gpt/trainer_runs.h"
#include "tests/test_util.h"
#include "tests/tolerance.h"

namespace strata::engine {
namespace {

using testing::RunLog;
using testing::run_log;
using testing::run;
using testing::tiny;

// Gradient accumulation: the loss is the micro-batches' mean (checked with a
// zero learning rate, where the weights never move), streamed and resident
// give the same bits, the loss falls, and a checkpoint refuses to resume
// under another accumulation count.
TEST(Trainer, GradientAccumulationAveragesMicroBatches) {
  uint64_t seed = strata::testing::test_seed(108);
  TrainerOptions frozen = tiny(seed);
  frozen.adam.lr = 0;
  frozen.adam.weight_decay = 0;
  std::vector<float> single = run(frozen, 4);
  ASSERT_EQ(single.size(), 4u);
  frozen.grad_accum = 2;
  std::vector<float> pairs = run(frozen, 2);
  ASSERT_EQ(pairs.size(), 2u);
  for (size_t k = 0; k < 2; ++k) {
    const float mean = static_cast<float>((static_cast<double>(single[2 * k]) + single[2 * k + 1]) / 2);
    EXPECT_EQ(pairs[k], mean) << "step " << k + 1;
  }

  strata::testing::TempDir dir;
  TrainerOptions o = tiny(seed);
  o.grad_accum = 3;
  std::vector<float> resident = run(o, 20);
  ASSERT_EQ(resident.size(), 20u);
  EXPECT_LT(resident.back(), 0.5f * resident.front());
  TrainerOptions streamed = o;
  streamed.stream_weights = true;
  streamed.device_bytes = 8ull << 20;
  streamed.prefetch_depth = 2;
  streamed.states = Tier::kNvme;
  streamed.nvme_paths = {dir.sub("accum")};
  EXPECT_EQ(run(streamed, 20), resident);
  std::vector<float> plain = run(tiny(seed), 20);
  EXPECT_NE(plain, resident);

  Result<std::unique_ptr<Trainer>> tr = Trainer::create(o);
  ASSERT_TRUE(tr) << tr.error().to_string();
  ASSERT_TRUE((*tr)->step());
  ASSERT_TRUE((*tr)->save(dir.sub("ckpt")).ok());
  TrainerOptions other = o;
  other.grad_accum = 2;
  Result<std::unique_ptr<Trainer>> tr2 = Trainer::create(other);
  ASSERT_TRUE(tr2) << tr2.error().to_string();
  Status s = (*tr2)->load(dir.sub("ckpt"));
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.to_string();
  EXPECT_NE(s.message().find("grad_accum 3"), std::string::npos) << s.to_string();
  other.grad_accum = 0;
  EXPECT_FALSE(Trainer::create(other));
}

// Steps on the caller's data: the model learns it (the loss falls), the
// same data gives the same bits in another placement, and a call with a
// wrong count or a token or target outside the vocabulary is refused with
// the reason and changes nothing (the run that met the refusals gives the
// same bits as the one that did not).
TEST(Trainer, StepsOnTheCallersDataAndRefusesBadDataChangingNothing) {
  uint64_t seed = strata::testing::test_seed(113);
  TrainerOptions o = tiny(seed);
  o.grad_accum = 2;
  const int64_t V = o.model.vocab, n = o.grad_accum * o.batch * o.seq;
  // Sequences that step by 5 from a random start: each target the token after.
  auto data = [&](int step, std::vector<int32_t>* tokens, std::vector<int32_t>* targets) {
    std::mt19937_64 rng(seed * 31 + static_cast<uint64_t>(step));
    tokens->resize(static_cast<size_t>(n));
    targets->resize(static_cast<size_t>(n));
    for (int64_t s = 0; s < n / o.seq; ++s) {
      int64_t x = static_cast<int64_t>(rng() % static_cast<uint64_t>(V));
      for (int64_t t = 0; t < o.seq; ++t) {
        (*tokens)[static_cast<size_t>(s * o.seq + t)] = static_cast<int32_t>(x);
        x = (x + 5) % V;
        (*targets)[static_cast<size_t>(s * o.seq + t)] = static_cast<int32_t>(x);
      }
    }
  };
  auto run_data = [&](const TrainerOptions& opts, int steps, bool with_refusals) {
    std::vector<float> losses;
    Result<std::unique_ptr<Trainer>> tr = Trainer::create(opts);
    EXPECT_TRUE(tr) << tr.error().to_string();
    if (!tr) return losses;
    std::vector<int32_t> tokens, targets;
    for (int k = 0; k < steps; ++k) {
      data(k, &tokens, &targets);
      if (with_refusals && k % 3 == 1) {
        std::vector<int32_t> bad = tokens;
        Result<float> r = (*tr)->step(std::span(bad).first(bad.size() - 1), targets);
        EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
        EXPECT_NE(r.status().message().find("expected " + std::to_string(n) + " tokens"), std::string::npos)
            << r.status().to_string();
        bad[7] = static_cast<int32_t>(V);
        r = (*tr)->step(bad, targets);
        EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
        EXPECT_NE(r.status().message().find("token 7 is " + std::to_string(V)), std::string::npos)
            << r.status().to_string();
        bad = targets;
        bad[n - 1] = -1;
        r = (*tr)->step(tokens, bad);
        EXPECT_NE(r.status().message().find("target " + std::to_string(n - 1) + " is -1"), std::string::npos)
            << r.status().to_string();
        EXPECT_EQ((*tr)->steps_done(), k);
      }
      Result<float> loss = (*tr)->step(tokens, targets);
      EXPECT_TRUE(loss) << loss.error().to_string();
      if (!loss) break;
      losses.push_back(*loss);
    }
    return losses;
  };
  std::vector<float> losses = run_data(o, 20, false);
  ASSERT_EQ(losses.size(), 20u);
  std::printf("the caller's data: loss %.4f -> %.4f\n", losses.front(), losses.back());
  EXPECT_LT(losses.back(), 0.5f * losses.front());
  EXPECT_EQ(run_data(o, 20, true), losses);
  strata::testing::TempDir dir;
  TrainerOptions streamed = o;
  streamed.stream_weights = true;
  streamed.device_bytes = 8ull << 20;
  streamed.states = Tier::kNvme;
  streamed.nvme_paths = {dir.sub("data")};
  EXPECT_EQ(run_data(streamed, 20, false), losses);
  // The data is what was trained on: the synthetic stream gives other losses.
  EXPECT_NE(run(o, 20), losses);
}

// The vertical order of accumulation (every micro-batch of a block while
// its weights are on the device) gives the bits of the one-at-a-time
// order — resident, streamed at depth 1 and 3, with the states and the
// weights on NVMe, with clipping and with fp16 overflows, on the synthetic
// stream and on the caller's data, with the delayed update against the
// delayed update — while the weights go to the device once per step
// instead of once per micro-batch (the one-at-a-time order keeps what is
// still on the device for the next micro-batch, so resident weights move
// once a step there too). Checkpoints off the device: the next test.
TEST(Trainer, VerticalAccumulationGivesTheSameBitsAndMovesTheWeightsOnce) {
  uint64_t seed = strata::testing::test_seed(117);
  strata::testing::TempDir dir;
  TrainerOptions base = tiny(seed);
  base.model.layers = 3;
  base.grad_accum = 3;
  // Runs `steps` steps; the host->device bytes of all of them, and the
  // last step's against the planner's link (within 3%; the tokens aside,
  // which it does not count).
  auto run_h2d = [](const TrainerOptions& o, int steps, std::vector<float>* losses, uint64_t* h2d) {
    Result<std::unique_ptr<Trainer>> tr = Trainer::create(o);
    ASSERT_TRUE(tr) << tr.error().to_string();
    *h2d = 0;
    for (int i = 0; i < steps; ++i) {
      Result<float> l = (*tr)->step();
      ASSERT_TRUE(l) << l.error().to_string();
      losses->push_back(*l);
      *h2d += (*tr)->last_counters().h2d_bytes;
    }
    const Plan plan = estimate(training_setup(o), run_placement(o), Bandwidths{});
    const double tokens = static_cast<double>(2 * o.grad_accum * o.batch * o.seq * 4);
    for (const LinkTime& link : plan.links) {
      if (link.link != "host->device") continue;
      const auto measured = static_cast<double>((*tr)->last_counters().h2d_bytes);
      EXPECT_NEAR(link.bytes + tokens, measured, strata::testing::kPlannedLinkBytesRel * measured)
          << (o.vertical_accumulation ? "vertical" : "one at a time") << ", depth " << o.prefetch_depth
          << (o.stream_weights ? " (streamed)" : " (resident)");
    }
  };
  int variant = 0;
  for (int depth : {0, 1, 3}) {
    for (Tier states : {Tier::kHost, Tier::kNvme}) {
      if (depth == 0 && states == Tier::kNvme) continue;
      TrainerOptions o = base;
      o.stream_weights = depth > 0;
      o.device_bytes = depth > 0 ? 8ull << 20 : 0;
      o.prefetch_depth = std::max(depth, 1);
      o.states = states;
      o.weights = depth > 0 && states == Tier::kNvme ? Tier::kNvme : Tier::kHost;
      o.nvme_paths = {dir.sub("v" + std::to_string(variant++))};
      // Clipping that fires on some steps, where the states speculate on NVMe.
      if (states == Tier::kNvme) o.clip_norm = 1.5f;
      std::vector<float> one, vertical;
      uint64_t h2d_one = 0, h2d_vertical = 0;
      run_h2d(o, 6, &one, &h2d_one);
      o.vertical_accumulation = true;
      o.nvme_paths = {dir.sub("v" + std::to_string(variant++))};
      run_h2d(o, 6, &vertical, &h2d_vertical);
      ASSERT_EQ(one.size(), 6u);
      EXPECT_EQ(vertical, one) << "prefetch depth " << depth << ", states on " << tier_name(states) << ", weights on "
                               << tier_name(o.weights);
      std::printf("depth %d, states on %s, weights on %s: host->device %llu bytes one at a time, %llu vertical\n",
                  depth, std::string(tier_name(states)).c_str(), std::string(tier_name(o.weights)).c_str(),
                  static_cast<unsigned long long>(h2d_one), static_cast<unsigned long long>(h2d_vertical));
      // Streamed through fewer slots than chunks, the one-at-a-time order
      // fetches the weights for every micro-batch; resident (and at depth 3,
      // where every chunk has a slot) both orders move them once a step.
      if (depth == 1) {
        EXPECT_LT(h2d_vertical, h2d_one / 2) << "streamed weights move once, not three times";
      } else {
        EXPECT_LT(h2d_one, h2d_vertical * 6 / 5) << "weights on the device stay there for the next micro-batch";
      }
    }
  }
  // fp16 with overflows, the delayed update, and the caller's data.
  TrainerOptions fp16 = base;
  fp16.precision = DType::kF16;
  fp16.loss_scale.initial_power = 24;
  fp16.loss_scale.window = 4;
  fp16.loss_scale.hysteresis = 1;
  fp16.stream_weights = true;
  fp16.device_bytes = 8ull << 20;
  RunLog ref = run_log(fp16, 8);
  EXPECT_GT(ref.skipped, 0);
  fp16.vertical_accumulation = true;
  RunLog got = run_log(fp16, 8);
  EXPECT_EQ(got.losses, ref.losses);
  EXPECT_EQ(got.scales, ref.scales);
  TrainerOptions delayed = base;
  delayed.delayed_update = true;
  const std::vector<float> delayed_one = run(delayed, 6);
  delayed.vertical_accumulation = true;
  EXPECT_EQ(run(delayed, 6), delayed_one);
  {
    TrainerOptions o = base;
    const int64_t n = o.grad_accum * o.batch * o.seq;
    std::vector<int32_t> tokens(static_cast<size_t>(n)), targets(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      tokens[static_cast<size_t>(i)] = static_cast<int32_t>((i * 7) % o.model.vocab);
      targets[static_cast<size_t>(i)] = static_cast<int32_t>((i * 7 + 7) % o.model.vocab);
    }
    std::vector<float> losses[2];
    for (int v = 0; v < 2; ++v) {
      o.vertical_accumulation = v == 1;
      Result<std::unique_ptr<Trainer>> tr = Trainer::create(o);
      ASSERT_TRUE(tr) << tr.error().to_string();
      for (int i = 0; i < 4; ++i) {
        Result<float> l = (*tr)->step(tokens, targets);
        ASSERT_TRUE(l) << l.error().to_string();
        losses[v].push_back(*l);
      }
    }
    EXPECT_EQ(losses[1], losses[0]);
  }
  // In groups: four micro-batches in passes of two, the same bits again;
  // the weights move twice a step; a group that does not divide is refused.
  {
    TrainerOptions o = base;
    o.grad_accum = 4;
    o.stream_weights = true;
    o.device_bytes = 8ull << 20;
    std::vector<float> losses[3];
    uint64_t h2d[3] = {0, 0, 0};
    for (int g = 0; g < 3; ++g) {
      o.vertical_accumulation = g > 0;
      o.vertical_group = g == 1 ? 2 : 0;
      run_h2d(o, 4, &losses[g], &h2d[g]);
    }
    EXPECT_EQ(losses[1], losses[0]);
    EXPECT_EQ(losses[2], losses[0]);
    EXPECT_LT(h2d[1], h2d[0]);
    EXPECT_LT(h2d[2], h2d[1]);
    o.vertical_accumulation = true;
    o.vertical_group = 3;
    Result<std::unique_ptr<Trainer>> bad = Trainer::create(o);
    ASSERT_FALSE(bad);
    EXPECT_NE(bad.error().message().find("vertical_group must divide grad_accum (4)"), std::string::npos)
        << bad.error().to_string();
  }
}

// The vertical order with the saved activations off the device: each
// pass's block input l (its micro-batches' inputs side by side) goes to the
// host or NVMe as one copy and comes back before its block's backward. The
// same bits as one micro-batch at a time with activations on the device,
// at prefetch depth 1 and 4, states in RAM and on NVMe, weights on NVMe,
// in groups of two; the weights move once per pass and the block inputs'
// bytes are each micro-batch's, as one at a time.
TEST(Trainer, VerticalAccumulationWithCheckpointsOnTheHostAndNvmeGivesTheSameBits) {
  const uint64_t seed = strata::testing::test_seed(131);
  strata::testing::TempDir dir;
  TrainerOptions base = tiny(seed);
  base.model.layers = 5;  // more block inputs than the gpt::kOffloadedInputBuffers that stay on the device
  base.grad_accum = 4;
  base.stream_weights = true;
  base.device_bytes = 8ull << 20;
  base.clip_norm = 1.5f;
  int variant = 0;
  struct Run {
    std::vector<float> losses;
    uint64_t h2d = 0, d2h = 0;
  };
  auto run_counted = [&](TrainerOptions o) {
    o.nvme_paths = {dir.sub("c" + std::to_string(variant++))};
    Run r;
    Result<std::unique_ptr<Trainer>> tr = Trainer::create(o);
    EXPECT_TRUE(tr) << tr.error().to_string();
    if (!tr) return r;
    for (int i = 0; i < 5; ++i) {
      Result<float> l = (*tr)->step();
      EXPECT_TRUE(l) << l.error().to_string();
      if (!l) return r;
      r.losses.push_back(*l);
      r.h2d += (*tr)->last_counters().h2d_bytes;
      r.d2h += (*tr)->last_counters().d2h_bytes;
    }
    return r;
  };
  const Run ref = run_counted(base);  // one at a time, activations on the device
  ASSERT_EQ(ref.losses.size(), 5u);
  for (Tier acts : {Tier::kHost, Tier::kNvme}) {
    for (int depth : {1, 4}) {
      for (Tier states : {Tier::kHost, Tier::kNvme}) {
        TrainerOptions o = base;
        o.activations = acts;
        o.prefetch_depth = depth;
        o.states = states;
        o.weights = states == Tier::kNvme && depth == 1 ? Tier::kNvme : Tier::kHost;
        const Run one = run_counted(o);
        o.vertical_accumulation = true;
        const Run vertical = run_counted(o);
        o.vertical_group = 2;
        const Run groups = run_counted(o);
        const std::string what = std::string("activations on ") + std::string(tier_name(acts)) + ", depth " +
                                 std::to_string(depth) + ", states on " + std::string(tier_name(states)) +
                                 ", weights on " + std::string(tier_name(o.weights)) + ", seed " +
                                 std::to_string(seed);
        EXPECT_EQ(one.losses, ref.losses) << what << ", one at a time";
        EXPECT_EQ(vertical.losses, ref.losses) << what << ", vertical";
        EXPECT_EQ(groups.losses, ref.losses) << what << ", vertical in groups of 2";
        // Streamed at depth 1 the weights move once per pass, not per
        // micro-batch; at depth 4 every chunk keeps a slot either way.
        if (depth == 1) {
          EXPECT_LT(vertical.h2d, groups.h2d) << what;
          EXPECT_LT(groups.h2d, one.h2d) << what;
        }
        // Gradients and block inputs go down the same bytes in every order.
        EXPECT_EQ(vertical.d2h, one.d2h) << what;
        EXPECT_EQ(groups.d2h, one.d2h) << what;
      }
    }
  }
}

}  // namespace
}  // namespace strata::engine
