// What a run is measured by: its trace (phases, optimizer calls, NVMe
// requests), the planner's bytes per tier against what the run used, and
// a model whose states are 20x its device's peak.
#include "models/gpt/trainer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "tests/models/gpt/trainer_runs.h"
#include "tests/test_util.h"
#include "tests/tolerance.h"

namespace strata::engine {
namespace {

using testing::run;
using testing::tiny;

// The planner counts the device with the functions the chunk store, the
// model ops and the GPT size their allocations by, each allocation as the
// device charges it: the run's peak, to the byte.
void expect_device_counted(double planned, double measured, const std::string& what) {
  EXPECT_EQ(planned, measured) << what << ": device planned " << planned << ", measured " << measured;
}

// With a trace, every step's phases, the optimizer's chunk updates and the
// NVMe reads and writes land on their tracks; without one nothing is recorded.
TEST(Trainer, TracesPhasesOptimizerCallsAndNvmeRequests) {
  strata::testing::TempDir dir;
  Trace trace(true);
  TrainerOptions o = tiny(strata::testing::test_seed(109));
  o.states = Tier::kNvme;
  o.nvme_paths = {dir.sub("t")};
  o.trace = &trace;
  o.stream_weights = true;
  o.device_bytes = 8ull << 20;
  o.model.layers = 4;  // block inputs 0 and 1 leave the device
  o.activations = Tier::kNvme;
  {
    auto tr = std::move(Trainer::create(o)).value();
    ASSERT_TRUE(tr->step());
    ASSERT_TRUE(tr->step());
    // The per-step counters: every NVMe byte (states and saved activations, whole
    // 4 KiB blocks), the copies, and the compute's waiting.
    const StepCounters& k = tr->last_counters();
    EXPECT_GT(k.nvme_read_bytes, tr->last_stage().nvme_bytes_read);  // the checkpoint came back from NVMe
    EXPECT_GT(k.nvme_written_bytes, tr->last_stage().nvme_bytes_written);
    EXPECT_GT(k.h2d_bytes, 0u);  // the streamed weights went up
    EXPECT_GT(k.d2h_bytes, 0u);  // and the gradients came back
    EXPECT_GE(k.device_idle_fraction, 0.0);
    EXPECT_LE(k.device_idle_fraction, 1.0);
  }
  const std::string json = trace.to_json();
  // Every NVMe request, whichever part issued it: state blobs (the
  // optimizer stage) and saved activations (the streamed model).
  // (The states are on NVMe and the steps speculate: each chunk's gradient
  // statistics come from its update's read of the gradient.)
  for (const char* want :
       {"step 1: forward+backward", "step 2: optimizer stage", "update chunk 2 + gradient stats", "update chunk 0",
        "read optimizer-state/chunk-1", "write optimizer-state/chunk-1", "write activation-checkpoint/",
        "read activation-checkpoint/", "forward block 1", "recompute+backward block 2", "host->device", "device->host",
        "\"copy stream\"", "\"trainer\"", "\"nvme reads\"", "\"nvme writes\"", "\"compute\""}) {
    EXPECT_NE(json.find(want), std::string::npos) << want;
  }
  const std::string path = dir.sub("out") + "/trace.json";
  ASSERT_TRUE(trace.write(path).ok());
  Trace off(false);
  o.trace = &off;
  o.nvme_paths = {dir.sub("u")};
  ASSERT_EQ(run(o, 1).size(), 1u);
  EXPECT_EQ(off.size(), 0u);
}

// The planner's bytes of every tier for a streamed placement are within 5%
// of what the run used (the device's within its alignment), over prefetch
// depths, checkpoint tiers and model shapes.
TEST(Trainer, PlannedBytesPerTierMatchWhatTheRunUsed) {
  struct Shape {
    int64_t layers, hidden, vocab, batch, seq;
  };
  struct Homes {
    Tier weights, states;
    Tier gradients = Tier::kHost;
  };
  // The working type and how Adam's m and v are stored.
  const std::pair<DType, cpu_optim::StateType> kinds[] = {{DType::kBF16, cpu_optim::StateType::kF32},
                                                           {DType::kF16, cpu_optim::StateType::kF32},
                                                           {DType::kBF16, cpu_optim::StateType::kBF16},
                                                           {DType::kBF16, cpu_optim::StateType::kQ8}};
  strata::testing::TempDir dir;
  int n = 0;
  double worst = 0;
  for (Shape sh : {Shape{2, 32, 64, 4, 16}, Shape{6, 64, 128, 2, 32}, Shape{3, 128, 256, 1, 64}}) {
    for (int depth : {1, 3}) {
      for (Tier acts : {Tier::kDevice, Tier::kHost, Tier::kNvme}) {
        for (Homes homes : {Homes{Tier::kHost, Tier::kHost}, Homes{Tier::kHost, Tier::kNvme},
                            Homes{Tier::kNvme, Tier::kNvme}, Homes{Tier::kHost, Tier::kNvme, Tier::kNvme}}) {
          for (const auto& [precision, st] : kinds) {
            if (precision == DType::kF16 && (sh.layers != 6 || depth != 1)) continue;
            // Low-precision Adam states: one shape and depth.
            if (st != cpu_optim::StateType::kF32 && (sh.layers != 6 || depth != 1)) continue;
            TrainerOptions o;
            o.model.layers = sh.layers, o.model.hidden = sh.hidden, o.model.heads = 4, o.model.vocab = sh.vocab;
            o.model.max_seq = sh.seq;
            o.batch = sh.batch;
            o.seq = sh.seq;
            o.stream_weights = true;
            o.device_bytes = 1ull << 30;
            o.prefetch_depth = depth;
            o.activations = acts;
            o.weights = homes.weights;
            o.states = homes.states;
            o.gradients = homes.gradients;
            o.precision = precision;
            o.adam_states = st;
            o.speculate_in_ram = homes.states == Tier::kHost && depth == 3;  // the second copy of the states
            // The widest shape's NVMe states in pieces (its blocks: 13 pieces).
            if (sh.hidden == 128) o.state_piece_elems = 4 * kStatePieceGranule;
            o.nvme_paths = {dir.sub("p" + std::to_string(n++))};
            const TrainSetup setup = training_setup(o);
            const Plan plan = estimate(setup, run_placement(o), Bandwidths{});
            Result<std::unique_ptr<Trainer>> tr = Trainer::create(o);
            ASSERT_TRUE(tr) << tr.error().to_string();
            ASSERT_TRUE((*tr)->step());
            ASSERT_TRUE((*tr)->step());
            const std::string what = std::to_string(sh.layers) + "x" + std::to_string(sh.hidden) + " depth " +
                                     std::to_string(depth) + ", weights on " + std::string(tier_name(homes.weights)) +
                                     ", states on " + std::string(tier_name(homes.states)) + ", activations on " +
                                     std::string(tier_name(acts)) + ", " + std::string(dtype_name(precision)) +
                                     ", " + std::string(cpu_optim::state_type_name(st)) + " Adam states" +
                                     (sh.hidden == 128 && homes.states == Tier::kNvme ? " in pieces" : "") +
                                     (homes.gradients == Tier::kNvme ? ", gradients on nvme" : "");
            const double measured[3] = {
                static_cast<double>((*tr)->device()->peak_bytes()), static_cast<double>((*tr)->host_bytes()),
                (*tr)->swap_store() ? static_cast<double>((*tr)->swap_store()->stats().peak_used_bytes) : 0.0};
            const double planned[3] = {static_cast<double>(plan.device.total()),
                                       static_cast<double>(plan.host.total()),
                                       static_cast<double>(plan.nvme.total())};
            const char* tiers[3] = {"device", "host", "nvme"};
            expect_device_counted(planned[0], measured[0], what);
            for (int k = 0; k < 3; ++k) {
              if (measured[k] == 0 && planned[k] == 0) continue;
              const double ratio = measured[k] > 0 ? planned[k] / measured[k] : 0.0;
              worst = std::max(worst, std::abs(ratio - 1.0));
              EXPECT_NEAR(ratio, 1.0, strata::testing::kPlannedBytesRel) << what << ": " << tiers[k] << " planned " << planned[k] << ", measured "
                                            << measured[k];
            }
            if (depth == 1 && acts != Tier::kHost) {
              std::printf("%s: planned/measured device %.4f host %.4f nvme %.4f\n", what.c_str(),
                          planned[0] / measured[0], planned[1] / measured[1],
                          measured[2] > 0 ? planned[2] / measured[2] : 0.0);
            }
          }
        }
      }
    }
  }
  // The delayed update's second set of gradient buffers (bf16, or the fp32
  // sums when accumulating), and of weights in RAM (none on NVMe, where the
  // update writes the blobs' other generation).
  for (int64_t accum : {1, 2}) {
    for (Tier weights : {Tier::kHost, Tier::kNvme}) {
      TrainerOptions o = tiny(7);
      o.grad_accum = accum;
      o.delayed_update = true;
      o.stream_weights = true;
      o.device_bytes = 1ull << 30;
      o.weights = weights;
      o.states = weights;  // weights on NVMe beside the states
      o.nvme_paths = {dir.sub("delayed" + std::to_string(n))};
      const TrainSetup setup = training_setup(o);
      const Plan plan = estimate(setup, run_placement(o), Bandwidths{});
      Result<std::unique_ptr<Trainer>> tr = Trainer::create(o);
      ASSERT_TRUE(tr) << tr.error().to_string();
      ASSERT_TRUE((*tr)->step());
      ASSERT_TRUE((*tr)->step());
      const double ratio = static_cast<double>(plan.host.total()) / static_cast<double>((*tr)->host_bytes());
      worst = std::max(worst, std::abs(ratio - 1.0));
      EXPECT_NEAR(ratio, 1.0, strata::testing::kPlannedBytesRel) << "delayed update, grad_accum " << accum << ", weights on " << tier_name(weights);
      if (weights == Tier::kNvme) {
        const double nvme = static_cast<double>(plan.nvme.total()) /
                            static_cast<double>((*tr)->swap_store()->stats().peak_used_bytes);
        worst = std::max(worst, std::abs(nvme - 1.0));
        EXPECT_NEAR(nvme, 1.0, strata::testing::kPlannedBytesRel) << "delayed update, grad_accum " << accum << ", nvme";
      }
      ++n;
    }
  }
  // The vertical order: grad_accum micro-batches' saved activations, block
  // gradients and embedding gradients at once — resident and streamed,
  // states in RAM and on NVMe, activations on the device, the host and
  // NVMe, every tier against the plan.
  for (int64_t accum : {2, 4, -4}) {  // -4: four micro-batches in passes of two
    for (int depth : {0, 1}) {
      for (Tier states : {Tier::kHost, Tier::kNvme}) {
        // In one pass with the states on NVMe, the gradients' sums on NVMe too.
        for (auto [acts, grads] : {std::pair{Tier::kDevice, Tier::kHost}, std::pair{Tier::kHost, Tier::kHost},
                                   std::pair{Tier::kNvme, Tier::kHost}, std::pair{Tier::kDevice, Tier::kNvme},
                                   std::pair{Tier::kHost, Tier::kNvme}, std::pair{Tier::kNvme, Tier::kNvme}}) {
          if (depth == 0 && acts != Tier::kDevice) continue;
          if (grads == Tier::kNvme && (states != Tier::kNvme || accum < 0)) continue;
          TrainerOptions o = tiny(11);
          o.gradients = grads;
          o.activations = acts;
          o.model.layers = 3;
          o.grad_accum = std::abs(accum);
          o.vertical_group = accum < 0 ? 2 : 0;
          o.vertical_accumulation = true;
          o.stream_weights = depth > 0;
          o.device_bytes = depth > 0 ? 1ull << 30 : 0;
          o.prefetch_depth = std::max(depth, 1);
          o.states = states;
          o.nvme_paths = {dir.sub("vertical" + std::to_string(n))};
          const Plan plan = estimate(training_setup(o), run_placement(o), Bandwidths{});
          Result<std::unique_ptr<Trainer>> tr = Trainer::create(o);
          ASSERT_TRUE(tr) << tr.error().to_string();
          ASSERT_TRUE((*tr)->step());
          ASSERT_TRUE((*tr)->step());
          const double measured[3] = {
              static_cast<double>((*tr)->device()->peak_bytes()), static_cast<double>((*tr)->host_bytes()),
              (*tr)->swap_store() ? static_cast<double>((*tr)->swap_store()->stats().peak_used_bytes) : 0.0};
          const double planned[3] = {static_cast<double>(plan.device.total()), static_cast<double>(plan.host.total()),
                                     static_cast<double>(plan.nvme.total())};
          expect_device_counted(planned[0], measured[0],
                                "vertical, grad_accum " + std::to_string(accum) + ", depth " + std::to_string(depth));
          for (int k = 0; k < 3; ++k) {
            if (measured[k] == 0 && planned[k] == 0) continue;
            const double ratio = measured[k] > 0 ? planned[k] / measured[k] : 0.0;
            worst = std::max(worst, std::abs(ratio - 1.0));
            EXPECT_NEAR(ratio, 1.0, strata::testing::kPlannedBytesRel) << "vertical, grad_accum " << accum << ", depth " << depth << ", states on "
                                          << tier_name(states) << ", activations on " << tier_name(acts)
                                          << ", gradients on " << tier_name(grads) << ": tier " << k << " planned "
                                          << planned[k] << ", measured " << measured[k];
          }
          ++n;
        }
      }
    }
  }
  // Resident weights (a slot for every chunk), states in RAM and on NVMe:
  // the device's peak against the plan.
  for (Tier states : {Tier::kHost, Tier::kNvme}) {
    TrainerOptions o = tiny(9);
    o.model.layers = 4;
    o.states = states;
    o.nvme_paths = {dir.sub("resident" + std::to_string(n))};
    const Plan plan = estimate(training_setup(o), run_placement(o), Bandwidths{});
    Result<std::unique_ptr<Trainer>> tr = Trainer::create(o);
    ASSERT_TRUE(tr) << tr.error().to_string();
    ASSERT_TRUE((*tr)->step());
    ASSERT_TRUE((*tr)->step());
    const double measured[2] = {static_cast<double>((*tr)->device()->peak_bytes()),
                                static_cast<double>((*tr)->host_bytes())};
    const double planned[2] = {static_cast<double>(plan.device.total()), static_cast<double>(plan.host.total())};
    expect_device_counted(planned[0], measured[0], "resident, states on " + std::string(tier_name(states)));
    for (int k = 0; k < 2; ++k) {
      const double ratio = planned[k] / measured[k];
      worst = std::max(worst, std::abs(ratio - 1.0));
      EXPECT_NEAR(ratio, 1.0, strata::testing::kPlannedBytesRel) << "resident, states on " << tier_name(states) << ": "
                                    << (k == 0 ? "device" : "host") << " planned " << planned[k] << ", measured "
                                    << measured[k];
    }
    ++n;
  }
  std::printf("%d placements; the worst planned/measured deviation over the three tiers: %.2f%%\n", n, worst * 100);
}

// Model states 20x the device budget: the run fits, stays inside the budget,
// and its loss falls.
TEST(Trainer, TrainsAModelWhoseStatesAre20xTheDeviceBudget) {
  TrainerOptions o;
  o.model.layers = 32, o.model.hidden = 128, o.model.heads = 4, o.model.vocab = 64, o.model.max_seq = 16;
  o.batch = 2;
  o.seq = 16;
  o.seed = strata::testing::test_seed(105);
  o.adam.lr = 2e-4f;  // deep and narrow: larger rates diverge here
  o.stream_weights = true;
  o.prefetch_depth = 1;
  // Everything that can leave the device lives on NVMe: weights, optimizer
  // states and saved activations.
  strata::testing::TempDir dir;
  o.weights = Tier::kNvme;
  o.states = Tier::kNvme;
  o.activations = Tier::kNvme;
  o.nvme_paths = {dir.sub("all")};
  const uint64_t states = 16ull * static_cast<uint64_t>(gpt::parameter_count(o.model));  // bf16 w+g, fp32 master+m+v
  o.device_bytes = states / 20;
  Result<std::unique_ptr<Trainer>> tr = Trainer::create(o);
  ASSERT_TRUE(tr) << tr.error().to_string();
  std::vector<float> losses;
  const int n = 60;
  for (int i = 0; i < n; ++i) {
    Result<float> loss = (*tr)->step();
    ASSERT_TRUE(loss) << loss.error().to_string();
    losses.push_back(*loss);
  }
  const gpu::Device* dev = (*tr)->device();
  ASSERT_NE(dev, nullptr);
  std::printf("model states %.1f MiB, device budget %.1f MiB (peak %.1f MiB), weights, states and saved activations on "
              "NVMe (%.1f MiB in use); loss %.3f -> %.3f\n",
              static_cast<double>(states) / (1 << 20), static_cast<double>(o.device_bytes) / (1 << 20),
              static_cast<double>(dev->peak_bytes()) / (1 << 20),
              static_cast<double>((*tr)->swap_store()->stats().used_bytes) / (1 << 20), losses.front(), losses.back());
  EXPECT_LE(dev->peak_bytes(), o.device_bytes);
  // What the test is named for, measured: the model states against the
  // most the device ever held (not against the budget it was given).
  ASSERT_GT(dev->peak_bytes(), 0u);
  const double ratio = static_cast<double>(states) / static_cast<double>(dev->peak_bytes());
  std::printf("model states / device peak: %.1fx\n", ratio);
  EXPECT_GE(ratio, 20.0);
  float head = (losses[0] + losses[1] + losses[2]) / 3, tail = (losses[n - 3] + losses[n - 2] + losses[n - 1]) / 3;
  EXPECT_LT(tail, 0.7f * head);
}

}  // namespace
}  // namespace strata::engine
