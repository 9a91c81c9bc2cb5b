// From a config to a trainer's options: every field the config gives, the
// refusals of what the trainer cannot run, the default budgets, and the
// planner's placement applied (NVMe only where paths are given).
#include "engine/trainer_config.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "tests/test_util.h"

namespace strata::engine {
namespace {

using nlohmann::json;

EngineConfig parse(const json& j) {
  std::vector<std::string> warnings;
  Result<EngineConfig> c = parse_config(j, &warnings);
  EXPECT_TRUE(c) << c.error().to_string();
  return c ? *c : EngineConfig{};
}

json small_model() {
  return {{"layers", 2}, {"hidden", 64}, {"heads", 4}, {"vocab", 128}, {"max_seq", 1024}};
}

TEST(TrainerConfig, OptionsCarryEveryFieldTheConfigGives) {
  strata::testing::TempDir dir;
  const EngineConfig c = parse(
      {{"model", small_model()},
       {"batch", {{"micro_batch", 3}, {"seq", 32}, {"grad_accum", 2}}},
       {"precision", "fp16"},
       {"states", "bf16"},
       {"optimizer", {{"type", "adam"}, {"lr", 0.25}, {"betas", {0.8, 0.9}}, {"eps", 1e-6}, {"weight_decay", 0.5}}},
       {"gradient_clipping", 2.0},
       {"nvme_paths", {dir.path()}},
       {"placement", {{"states", "nvme"}, {"sub_group_size", 1 << 20}}},
       {"seed", 9},
       {"numa_node", 0},
       {"pin_memory", false},
       {"delayed_update", true}});
  Result<TrainerOptions> o = trainer_options(c);
  ASSERT_TRUE(o) << o.error().to_string();
  EXPECT_EQ(o->model.hidden, 64);
  EXPECT_EQ(o->batch, 3);
  EXPECT_EQ(o->seq, 32);
  EXPECT_EQ(o->grad_accum, 2);
  EXPECT_EQ(o->seed, 9u);
  EXPECT_EQ(o->adam.lr, 0.25f);
  EXPECT_EQ(o->adam.beta1, 0.8f);
  EXPECT_EQ(o->adam.beta2, 0.9f);
  EXPECT_EQ(o->adam.eps, 1e-6f);
  EXPECT_EQ(o->adam.weight_decay, 0.5f);
  EXPECT_FALSE(o->adam.decoupled_weight_decay);  // "adam": L2, coupled
  EXPECT_EQ(o->clip_norm, 2.0f);
  EXPECT_EQ(o->precision, DType::kF16);
  EXPECT_EQ(o->adam_states, cpu_optim::StateType::kBF16);
  EXPECT_EQ(o->states, Tier::kNvme);
  EXPECT_EQ(o->nvme_paths, std::vector<std::string>{dir.path()});
  EXPECT_EQ(o->state_piece_elems, 1 << 20);
  EXPECT_EQ(o->numa_node, 0);
  EXPECT_FALSE(o->pin_memory);
  EXPECT_TRUE(o->delayed_update);
  EXPECT_FALSE(o->stream_weights);  // no placement applied yet
  const Result<TrainerOptions> w =
      trainer_options(parse({{"model", small_model()}, {"optimizer", {{"type", "adamw"}}}}));
  ASSERT_TRUE(w);
  EXPECT_TRUE(w->adam.decoupled_weight_decay);
  EXPECT_EQ(w->states, Tier::kHost);
}

TEST(TrainerConfig, WhatTheTrainerCannotRunIsRefusedNamingTheKey) {
  Result<TrainerOptions> o = trainer_options(parse({{"model", small_model()}, {"optimizer", {{"type", "lion"}}}}));
  ASSERT_FALSE(o);
  EXPECT_EQ(o.error().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(o.error().message().find("optimizer.type"), std::string::npos) << o.error().to_string();
  o = trainer_options(parse({{"model", small_model()}, {"precision", "fp32"}}));
  ASSERT_FALSE(o);
  EXPECT_NE(o.error().message().find("precision"), std::string::npos) << o.error().to_string();
}

TEST(TrainerConfig, MissingBudgetsGetTheHostDefaults) {
  bool defaulted = false;
  Budgets b = budgets_or_defaults(Budgets{}, &defaulted);
  EXPECT_TRUE(defaulted);
  EXPECT_EQ(b.device_bytes, 1ull << 30);
  EXPECT_GT(b.host_bytes, 0u);
  b = budgets_or_defaults(Budgets{5, 7, 11}, &defaulted);
  EXPECT_FALSE(defaulted);
  EXPECT_EQ(b.device_bytes, 5u);
  EXPECT_EQ(b.host_bytes, 7u);
  EXPECT_EQ(b.nvme_bytes, 11u);
}

// The planner's placement lands in the options: with room everywhere the
// model stays resident; a device too small for it streams the weights; a
// host too small for the states puts them on NVMe when there are paths, and
// is the planner's error (naming what does not fit) when there are none.
TEST(TrainerConfig, ThePlannersPlacementIsApplied) {
  strata::testing::TempDir dir;
  const EngineConfig c =
      parse({{"model", {{"layers", 8}, {"hidden", 256}, {"heads", 4}, {"vocab", 256}, {"max_seq", 64}}},
             {"batch", {{"micro_batch", 4}, {"seq", 64}}}});
  Result<TrainerOptions> base = trainer_options(c);
  ASSERT_TRUE(base);
  TrainerOptions o = *base;
  Result<Plan> p = apply_planned_placement(&o, Budgets{4ull << 30, 4ull << 30, 0}, {}, {});
  ASSERT_TRUE(p) << p.error().to_string();
  EXPECT_FALSE(o.stream_weights);
  EXPECT_EQ(o.states, Tier::kHost);
  EXPECT_EQ(o.device_bytes, 0u);
  EXPECT_TRUE(o.nvme_paths.empty());

  o = *base;
  p = apply_planned_placement(&o, Budgets{24ull << 20, 4ull << 30, 0}, {}, {});
  ASSERT_TRUE(p) << p.error().to_string();
  EXPECT_TRUE(o.stream_weights);
  EXPECT_EQ(o.device_bytes, 24ull << 20);
  EXPECT_EQ(o.prefetch_depth, p->placement.prefetch_depth);

  o = *base;
  p = apply_planned_placement(&o, Budgets{24ull << 20, 80ull << 20, 0}, {}, {});
  ASSERT_FALSE(p);
  EXPECT_EQ(p.error().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(p.error().message().find("host needs"), std::string::npos) << p.error().to_string();
  p = apply_planned_placement(&o, Budgets{24ull << 20, 80ull << 20, 0}, {}, {dir.path()});
  ASSERT_TRUE(p) << p.error().to_string();
  EXPECT_EQ(o.states, Tier::kNvme);
  EXPECT_EQ(o.nvme_paths, std::vector<std::string>{dir.path()});
  // The config's constraints bind the planner.
  o = *base;
  Constraints fixed;
  fixed.states = Tier::kNvme;
  p = apply_planned_placement(&o, Budgets{4ull << 30, 4ull << 30, 0}, fixed, {dir.path()});
  ASSERT_TRUE(p) << p.error().to_string();
  EXPECT_EQ(o.states, Tier::kNvme);
}

}  // namespace
}  // namespace strata::engine
