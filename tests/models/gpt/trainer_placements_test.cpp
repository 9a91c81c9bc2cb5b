// Placements drawn at random: for one run's numbers (seed, precision, Adam
// state type, accumulation, clipping) every placement and schedule the
// trainer runs gives the same losses, gradient norms and loss scales, bit
// for bit (the delayed update's own, when the run has one) — resident or
// streamed at any prefetch depth; weights, optimizer states and saved activations on any tier they may live on;
// one micro-batch at a time or the vertical order in any group; speculation on NVMe or in RAM, or none; states in
// pieces; the gradients on NVMe through a ring of 1-4 buffers; io_uring or POSIX at queue depth 1, 4 or 32,
// striped over one or two directories, with 3-6 staging buffers; transient NVMe faults (EAGAIN, EINTR, short
// transfers, transient EIO, late and reordered completions), which the I/O
// layer retries unseen. trainer_test.cpp holds the placements it names one by
// one; this test covers their combinations, a different set for every seed
// (STRATA_TEST_SEED replays one; each failure prints its placement).
#include <gtest/gtest.h>

#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "engine/checkpoint_io.h"
#include "models/gpt/trainer.h"
#include "tests/test_util.h"

namespace strata::engine {
namespace {

// What a run computed, step by step.
struct Outcome {
  std::vector<float> losses;
  std::vector<double> norms, scales;
  bool operator==(const Outcome&) const = default;
};

Outcome run(const TrainerOptions& o, int steps, std::string* error) {
  Outcome out;
  Result<std::unique_ptr<Trainer>> tr = Trainer::create(o);
  if (!tr) {
    *error = tr.error().to_string();
    return out;
  }
  for (int i = 0; i < steps; ++i) {
    out.scales.push_back((*tr)->loss_scale());
    Result<float> loss = (*tr)->step();
    if (!loss) {
      *error = "step " + std::to_string(i + 1) + ": " + loss.error().to_string();
      return out;
    }
    out.losses.push_back(*loss);
    out.norms.push_back((*tr)->last_grad_norm());
  }
  return out;
}

// The run's numbers: everything that may change the bits.
TrainerOptions numbers(std::mt19937_64& rng, uint64_t seed) {
  auto pick = [&rng](int n) { return static_cast<int>(rng() % static_cast<uint64_t>(n)); };
  TrainerOptions o;
  o.model.layers = 3 + pick(3);  // more blocks than the checkpoint buffers that stay on the device
  o.model.hidden = 32, o.model.heads = 4, o.model.vocab = 64, o.model.max_seq = 16;
  o.batch = 2 + pick(2);
  o.seq = 16;
  o.seed = seed;
  o.adam.lr = 1e-2f;
  o.adam.weight_decay = 0.01f;
  o.grad_accum = std::vector<int64_t>{1, 2, 4}[static_cast<size_t>(pick(3))];
  o.adam_states = std::vector<cpu_optim::StateType>{cpu_optim::StateType::kF32, cpu_optim::StateType::kBF16,
                                                    cpu_optim::StateType::kQ8}[static_cast<size_t>(pick(3))];
  if (pick(2) == 1) o.clip_norm = 1.0f + 0.5f * static_cast<float>(pick(3));  // fires on some steps
  if (pick(3) == 0) {
    // fp16, with a loss scale that overflows on some steps (skipped).
    o.precision = DType::kF16;
    o.loss_scale.initial_power = 24;
    o.loss_scale.window = 3;
    o.loss_scale.hysteresis = 1;
  }
  // The delayed update: other numbers than the exact schedule's, but its
  // own in every placement.
  o.delayed_update = pick(4) == 0;
  return o;
}

// A placement of `base`'s run; `what` says which, for the failure message.
TrainerOptions placement(const TrainerOptions& base, std::mt19937_64& rng, const std::string& dir, std::string* what) {
  auto pick = [&rng](int n) { return static_cast<int>(rng() % static_cast<uint64_t>(n)); };
  TrainerOptions o = base;
  o.nvme_paths = {dir + "/a"};
  if (pick(2) == 0) o.nvme_paths.push_back(dir + "/b");  // striped over two directories
  for (const std::string& d : o.nvme_paths) std::filesystem::create_directories(d);
  o.stream_weights = pick(3) != 0;
  o.device_bytes = o.stream_weights ? 8ull << 20 : 0;
  o.prefetch_depth = 1 + pick(4);
  o.states = pick(2) == 0 ? Tier::kHost : Tier::kNvme;
  o.weights = o.stream_weights && o.states == Tier::kNvme && pick(2) == 0 ? Tier::kNvme : Tier::kHost;
  o.activations = o.stream_weights
                      ? std::vector<Tier>{Tier::kDevice, Tier::kHost, Tier::kNvme}[static_cast<size_t>(pick(3))]
                      : Tier::kDevice;
  if (o.grad_accum > 1 && pick(2) == 0) {
    o.vertical_accumulation = true;
    o.vertical_group = o.grad_accum == 4 && pick(2) == 0 ? 2 : 0;
  }
  if (o.states == Tier::kHost) {
    o.speculate_in_ram = pick(2) == 0;
  } else {
    o.speculate = pick(4) != 0;
    if (pick(2) == 0) o.state_piece_elems = kStatePieceGranule;  // every chunk in pieces
    if (gradients_run_on_nvme(training_setup(o), o.states, micro_batches_per_pass(o)) && pick(2) == 0) {
      o.gradients = Tier::kNvme;  // a ring of 1-4 chunk buffers
      o.gradient_buffers = 1 + pick(4);
    }
  }
  const bool nvme = o.states == Tier::kNvme || o.activations == Tier::kNvme;
  if (nvme) {
    o.io_backend = pick(2) == 0 ? io::Backend::kPosix : io::Backend::kAuto;
    o.io_queue_depth = std::vector<uint32_t>{1, 4, 32}[static_cast<size_t>(pick(3))];
    o.io_stripe_unit_bytes = pick(2) == 0 ? uint64_t{64} << 10 : uint64_t{1} << 20;
    o.staging_buffers = 3 + pick(4);
    if (pick(2) == 0) {
      io::FaultConfig f;
      f.seed = rng();
      f.eagain_one_in = 7;
      f.eintr_one_in = 11;
      f.short_transfer_one_in = 5;
      f.eio_transient_one_in = 13;
      f.latency_one_in = 9;
      f.latency_us = 100;
      f.reorder = true;
      o.faults = f;
    }
  }
  *what =
      std::string(o.stream_weights ? "streamed, depth " + std::to_string(o.prefetch_depth) : "resident") +
      ", weights on " + std::string(tier_name(o.weights)) + ", states on " + std::string(tier_name(o.states)) +
      ", activations on " + std::string(tier_name(o.activations)) +
      (o.vertical_accumulation
           ? ", vertical" + (o.vertical_group > 0 ? " in groups of " + std::to_string(o.vertical_group) : "")
           : "") +
      (o.speculate_in_ram ? ", speculating in RAM" : "") +
      (o.states == Tier::kNvme && !o.speculate ? ", no speculation" : "") +
      (o.state_piece_elems == kStatePieceGranule ? ", states in pieces" : "") +
      (o.gradients == Tier::kNvme ? ", gradients on nvme in a ring of " + std::to_string(o.gradient_buffers) : "") +
      (nvme && o.io_backend == io::Backend::kPosix ? ", POSIX I/O" : "") +
      (nvme ? ", queue depth " + std::to_string(o.io_queue_depth) + ", stripe " +
                  std::to_string(o.io_stripe_unit_bytes >> 10) + " KiB over " + std::to_string(o.nvme_paths.size()) +
                  " dir(s), " + std::to_string(o.staging_buffers) + " staging buffers"
            : "") +
      (o.faults ? ", transient faults" : "");
  return o;
}

std::string numbers_text(const TrainerOptions& o) {
  char clip[32];
  std::snprintf(clip, sizeof clip, "%g", static_cast<double>(o.clip_norm));
  return std::to_string(o.model.layers) + " blocks, batch " + std::to_string(o.batch) + ", grad_accum " +
         std::to_string(o.grad_accum) + ", " + std::string(dtype_name(o.precision)) + ", " +
         std::string(cpu_optim::state_type_name(o.adam_states)) + " Adam states, clip " + clip +
         (o.delayed_update ? ", delayed update" : "");
}

// The placement rules are written once (check_placement): over every
// combination of tiers, speculation, accumulation order, the delayed update
// and fp32 working weights, the trainer creates exactly the runs they
// accept and refuses the rest with their words, and the planner proposes
// only placements they accept — the resident ones too.
TEST(TrainerPlacements, TheTrainerAndThePlannerFollowOneSetOfRules) {
  strata::testing::TempDir dir;
  const std::vector<Tier> tiers = {Tier::kDevice, Tier::kHost, Tier::kNvme};
  struct Run {
    DType precision;
    int64_t accum;
    bool vertical, delayed;
  };
  int accepted = 0, refused = 0;
  for (const Run& r : {Run{DType::kBF16, 1, false, false}, Run{DType::kF32, 2, true, false},
                       Run{DType::kBF16, 2, false, false}, Run{DType::kBF16, 1, false, true}}) {
    for (Tier w : tiers) {
      for (Tier st : tiers) {
        for (Tier ck : tiers) {
          for (Tier g : {Tier::kHost, Tier::kNvme}) {
            for (bool spec : {false, true}) {
              TrainerOptions o;
              o.model.layers = 2;
              o.model.hidden = 32, o.model.heads = 4, o.model.vocab = 64, o.model.max_seq = 16;
              o.batch = 1, o.seq = 8;
              o.precision = r.precision;
              o.grad_accum = r.accum;
              o.vertical_accumulation = r.vertical;
              o.delayed_update = r.delayed;
              o.stream_weights = w != Tier::kDevice;
              o.weights = w == Tier::kNvme ? Tier::kNvme : Tier::kHost;
              o.states = st;
              o.activations = ck;
              o.gradients = g;
              o.speculate_in_ram = spec;
              o.nvme_paths = {dir.path()};
              const Status rule = check_placement(training_setup(o), run_placement(o));
              const std::string what = placement_text(run_placement(o)) + " (" + std::string(dtype_name(r.precision)) +
                                       ", grad_accum " + std::to_string(r.accum) + (r.delayed ? ", delayed" : "") + ")";
              Result<std::unique_ptr<Trainer>> tr = Trainer::create(o);
              if (rule.ok()) {
                ++accepted;
                EXPECT_TRUE(tr) << what << ": " << tr.error().to_string();
              } else {
                ++refused;
                ASSERT_FALSE(tr) << what << " runs, but the rules say: " << rule.to_string();
                EXPECT_EQ(tr.error().code(), StatusCode::kInvalidArgument) << what;
                EXPECT_NE(tr.error().to_string().find(rule.message()), std::string::npos)
                    << what << ": " << tr.error().to_string() << " is not " << rule.to_string();
              }
            }
          }
        }
      }
      // The planner, with every tier open and then each weight tier fixed.
      const TrainSetup setup = [&] {
        TrainerOptions o;
        o.model.layers = 2;
        o.model.hidden = 32, o.model.heads = 4, o.model.vocab = 64, o.model.max_seq = 16;
        o.precision = r.precision, o.grad_accum = r.accum, o.delayed_update = r.delayed;
        o.vertical_accumulation = r.vertical;
        return training_setup(o);
      }();
      Constraints fixed;
      fixed.weights = w;
      Result<Plan> plan = make_plan(setup, Budgets{1ull << 30, 1ull << 30, 1ull << 30}, Bandwidths{}, fixed);
      // Every weight tier has a placement, but NVMe for fp32 weights.
      ASSERT_EQ(plan.has_value(), !(r.precision == DType::kF32 && w == Tier::kNvme)) << tier_name(w);
      if (plan) {
        EXPECT_EQ(plan->placement.weights, w);
        EXPECT_TRUE(check_placement(setup, plan->placement).ok()) << placement_text(plan->placement);
      }
    }
  }
  // Both sides of the rules were exercised.
  EXPECT_GT(accepted, 50);
  EXPECT_GT(refused, 50);
}

TEST(TrainerPlacements, RandomPlacementsGiveTheSameBits) {
  const uint64_t seed = strata::testing::test_seed(20261201);
  std::mt19937_64 rng(seed);
  strata::testing::TempDir dir;
  constexpr int kRuns = 12, kPlacements = 5, kSteps = 6;
  int variant = 0;
  for (int r = 0; r < kRuns; ++r) {
    const TrainerOptions base = numbers(rng, rng());
    std::string error;
    const Outcome ref = run(base, kSteps, &error);  // resident, states in RAM, one micro-batch at a time
    ASSERT_TRUE(error.empty()) << numbers_text(base) << ": " << error;
    ASSERT_EQ(ref.losses.size(), static_cast<size_t>(kSteps));
    for (int k = 0; k < kPlacements; ++k) {
      std::string what;
      const TrainerOptions o = placement(base, rng, dir.sub("p" + std::to_string(variant++)), &what);
      const Outcome got = run(o, kSteps, &error);
      ASSERT_TRUE(error.empty()) << numbers_text(base) << "; " << what << ": " << error << " (seed " << seed << ")";
      EXPECT_EQ(got.losses, ref.losses) << numbers_text(base) << "; " << what << " (seed " << seed << ")";
      EXPECT_EQ(got.norms, ref.norms) << numbers_text(base) << "; " << what;
      EXPECT_EQ(got.scales, ref.scales) << numbers_text(base) << "; " << what;
      std::printf("%s; %s: the same %d losses\n", numbers_text(base).c_str(), what.c_str(), kSteps);
    }
  }
}

// Persistent NVMe faults at random moments of random placements: an EIO
// that strikes reads, or an EIO or ENOSPC that strikes writes, after a
// random number of good ones
// ends its step with UNAVAILABLE or RESOURCE_EXHAUSTED and changes nothing —
// once the disk is well again the step is retried and the run goes on with
// the bits of the run that never failed — with the delayed update too,
// whose update beside a failed step goes on, or, failed itself, is begun
// again from the same gradients.
// Checkpoints are saved after some steps with their state reads failing at
// a random moment too: a save completes or fails leaving `latest` as it
// was, and the run resumes from the last one that completed with the same
// bits.
TEST(TrainerPlacements, FaultsAtRandomMomentsEndTheirStepAndChangeNothing) {
  const uint64_t seed = strata::testing::test_seed(20261202);
  std::mt19937_64 rng(seed);
  strata::testing::TempDir dir;
  constexpr int kRuns = 8, kSteps = 6;
  int variant = 0, failed_steps = 0, failed_delayed = 0, failed_grads_nvme = 0, saves_done = 0, saves_failed = 0,
      resumes = 0;
  for (int r = 0; r < kRuns; ++r) {
    const TrainerOptions base = numbers(rng, rng());
    std::string error;
    const Outcome ref = run(base, kSteps, &error);
    ASSERT_TRUE(error.empty()) << numbers_text(base) << ": " << error;
    std::string what;
    TrainerOptions o;
    do {  // a placement with something on NVMe
      o = placement(base, rng, dir.sub("f" + std::to_string(variant++)), &what);
    } while (o.states != Tier::kNvme && o.activations != Tier::kNvme);
    if (!o.faults) o.faults = io::FaultConfig{};
    Result<std::unique_ptr<Trainer>> tr = Trainer::create(o);
    ASSERT_TRUE(tr) << what << ": " << tr.error().to_string();
    Outcome got;
    // After some steps a checkpoint, its reads failing at a random moment
    // too: a save either completes or fails leaving `latest` as it was;
    // whatever the faults, the run resumes from the last one that completed.
    const std::string root = dir.sub("ck" + std::to_string(r));
    int64_t saved = 0;
    auto maybe_save = [&](int i) {
      // (A save lands the delayed update in flight: later steps differ from
      // the run that did not save.)
      if (base.delayed_update || rng() % 2 != 0) return;
      const auto good = static_cast<uint32_t>(rng() % 16);
      (*tr)->swap_store()->with_faults([&](io::FaultyDevice& d) { d.fail_next(io::IoOp::kRead, EIO, 1000, good); });
      Status st = (*tr)->save(root);
      (*tr)->swap_store()->with_faults([](io::FaultyDevice& d) { d.clear_forced(); });
      if (st.ok()) {
        saved = i + 1;
        ++saves_done;
        return;
      }
      ++saves_failed;
      EXPECT_EQ(st.code(), StatusCode::kUnavailable) << what << "; save after step " << i + 1 << ": " << st.to_string();
      Result<CheckpointDir::Entry> latest = CheckpointDir(root).latest();
      if (saved == 0) {
        EXPECT_FALSE(latest) << what << ": a failed first save left a checkpoint";
      } else {
        EXPECT_TRUE(latest && latest->step == saved) << what << ": the failed save moved latest";
      }
    };
    for (int i = 0; i < kSteps; ++i) {
      const double scale = (*tr)->loss_scale();
      const io::IoOp op = rng() % 2 == 0 ? io::IoOp::kRead : io::IoOp::kWrite;
      const int err = op == io::IoOp::kWrite && rng() % 2 == 0 ? ENOSPC : EIO;  // a read never meets ENOSPC
      const auto good = static_cast<uint32_t>(rng() % 24);
      // (Under the store's lock: a delayed update may be running beside.)
      (*tr)->swap_store()->with_faults([&](io::FaultyDevice& d) { d.fail_next(op, err, 1000, good); });
      Result<float> bad = (*tr)->step();
      (*tr)->swap_store()->with_faults([](io::FaultyDevice& d) { d.clear_forced(); });
      const std::string at = numbers_text(base) + "; " + what + "; step " + std::to_string(i + 1) + ", " +
                             std::string(io::io_op_name(op)) + "s fail with " + (err == EIO ? "EIO" : "ENOSPC") +
                             " after " + std::to_string(good) + " (seed " + std::to_string(seed) + ")";
      got.scales.push_back(scale);
      if (bad) {  // the faults struck nothing this step uses after `good` requests
        got.losses.push_back(*bad);
        got.norms.push_back((*tr)->last_grad_norm());
        maybe_save(i);
        continue;
      }
      ++failed_steps;
      failed_delayed += base.delayed_update ? 1 : 0;
      failed_grads_nvme += o.gradients == Tier::kNvme ? 1 : 0;
      EXPECT_TRUE(bad.error().code() == StatusCode::kUnavailable ||
                  bad.error().code() == StatusCode::kResourceExhausted)
          << at << ": " << bad.error().to_string();
      EXPECT_EQ((*tr)->steps_done(), i) << at;
      EXPECT_EQ((*tr)->loss_scale(), scale) << at << ": the failed step moved the loss scale";
      // Well again. The delayed update beside the failed step may have met
      // the fault too: its error comes with the first retry, which begins
      // it again; the second then runs.
      Result<float> again = (*tr)->step();
      if (!again && base.delayed_update) {
        EXPECT_EQ((*tr)->steps_done(), i) << at;
        again = (*tr)->step();
      }
      ASSERT_TRUE(again) << at << ", then well again: " << again.error().to_string();
      got.losses.push_back(*again);
      got.norms.push_back((*tr)->last_grad_norm());
      maybe_save(i);
    }
    EXPECT_EQ(got.losses, ref.losses) << numbers_text(base) << "; " << what << " (seed " << seed << ")";
    EXPECT_EQ(got.norms, ref.norms) << numbers_text(base) << "; " << what;
    EXPECT_EQ(got.scales, ref.scales) << numbers_text(base) << "; " << what;
    if (saved > 0 && saved < kSteps) {
      TrainerOptions again = o;
      again.faults.reset();
      again.initial_state = false;
      again.nvme_paths = {dir.sub("resumed" + std::to_string(r))};
      Result<std::unique_ptr<Trainer>> resumed = Trainer::create(again);
      ASSERT_TRUE(resumed) << resumed.error().to_string();
      Status st = (*resumed)->load(root);
      ASSERT_TRUE(st.ok()) << what << ": " << st.to_string();
      ASSERT_EQ((*resumed)->steps_done(), saved);
      for (int64_t i = saved; i < kSteps; ++i) {
        Result<float> loss = (*resumed)->step();
        ASSERT_TRUE(loss) << loss.error().to_string();
        EXPECT_EQ(*loss, ref.losses[static_cast<size_t>(i)]) << what << ": resumed at " << saved << ", step " << i + 1;
      }
      ++resumes;
    }
  }
  std::printf("%d saves completed, %d failed on a fault; %d runs resumed from the last one\n", saves_done, saves_failed,
              resumes);
  std::printf(
      "%d of %d steps failed on a fault and were retried (%d of them delayed-update steps, %d with the gradients on "
      "NVMe)\n",
      failed_steps, kRuns * kSteps, failed_delayed, failed_grads_nvme);
  EXPECT_GT(failed_steps, 0) << "no fault struck: the test checked nothing";
}

}  // namespace
}  // namespace strata::engine
