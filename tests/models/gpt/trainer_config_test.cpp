// From a config to a trainer's options: every field the config gives, the
// refusals of what the trainer cannot run, the default budgets, and the
// planner's placement applied (NVMe only where paths are given).
#include "models/gpt/trainer_config.h"

#include <gtest/gtest.h>

#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <random>
#include <set>

#include "tests/test_util.h"

namespace strata::engine {
namespace {

using nlohmann::json;

GptRunConfig parse(const json& j) {
  std::vector<std::string> warnings;
  Result<GptRunConfig> c = parse_gpt_config(j, &warnings);
  EXPECT_TRUE(c) << c.error().to_string();
  return c ? *c : GptRunConfig{};
}

json small_model() {
  return {{"layers", 2}, {"hidden", 64}, {"heads", 4}, {"vocab", 128}, {"max_seq", 1024}};
}

TEST(TrainerConfig, OptionsCarryEveryFieldTheConfigGives) {
  strata::testing::TempDir dir;
  const GptRunConfig c = parse(
      {{"model", small_model()},
       {"batch", {{"micro_batch", 3}, {"seq", 32}, {"grad_accum", 2}, {"vertical", true}}},
       {"precision", "fp16"},
       {"states", "bf16"},
       {"optimizer", {{"type", "adam"}, {"lr", 0.25}, {"betas", {0.8, 0.9}}, {"eps", 1e-6}, {"weight_decay", 0.5}}},
       {"gradient_clipping", 2.0},
       {"nvme_paths", {dir.path()}},
       {"placement", {{"states", "nvme"}, {"sub_group_size", 1 << 20}}},
       {"seed", 9},
       {"numa_node", 0},
       {"pin_memory", false},
       {"delayed_update", true},
       {"schedule", {{"warmup_steps", 3}, {"decay", "linear"}, {"decay_end_step", 30}}},
       {"io", {{"backend", "posix"}, {"queue_depth", 8}, {"block_size", "256KiB"}, {"direct", "prefer"}}}});
  Result<TrainerOptions> o = trainer_options(c);
  ASSERT_TRUE(o) << o.error().to_string();
  EXPECT_EQ(o->model.hidden, 64);
  EXPECT_EQ(o->batch, 3);
  EXPECT_EQ(o->seq, 32);
  EXPECT_EQ(o->grad_accum, 2);
  EXPECT_TRUE(o->vertical_accumulation);
  EXPECT_EQ(o->seed, 9u);
  EXPECT_EQ(o->adam.lr, 0.25);
  EXPECT_EQ(o->adam.beta1, 0.8);
  EXPECT_EQ(o->adam.beta2, 0.9);
  EXPECT_EQ(o->adam.eps, 1e-6);
  EXPECT_EQ(o->adam.weight_decay, 0.5);
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
  EXPECT_EQ(o->lr_schedule.warmup_steps, 3);
  EXPECT_EQ(o->lr_schedule.decay, LrSchedule::Decay::kLinear);
  EXPECT_EQ(o->lr_schedule.decay_end_step, 30);
  EXPECT_EQ(o->io_backend, io::Backend::kPosix);
  EXPECT_EQ(o->io_queue_depth, 8u);
  EXPECT_EQ(o->io_stripe_unit_bytes, 256u << 10);
  EXPECT_EQ(o->io_direct, io::DirectMode::kPrefer);
  EXPECT_FALSE(o->stream_weights);  // no placement applied yet
  const Result<TrainerOptions> w =
      trainer_options(parse({{"model", small_model()}, {"optimizer", {{"type", "adamw"}}}}));
  ASSERT_TRUE(w);
  EXPECT_TRUE(w->adam.decoupled_weight_decay);
  EXPECT_EQ(w->states, Tier::kHost);
  // The NVMe paths go with the options whatever the run puts there (here
  // the block inputs, with the states in RAM).
  const Result<TrainerOptions> k = trainer_options(
      parse({{"model", small_model()}, {"nvme_paths", {dir.path()}}, {"placement", {{"activations", "nvme"}}}}));
  ASSERT_TRUE(k) << k.error().to_string();
  EXPECT_EQ(k->states, Tier::kHost);
  EXPECT_EQ(k->nvme_paths, std::vector<std::string>{dir.path()});
}

TEST(TrainerConfig, WhatTheTrainerCannotRunIsRefusedNamingTheKey) {
  Result<TrainerOptions> o = trainer_options(parse({{"model", small_model()}, {"optimizer", {{"type", "lion"}}}}));
  ASSERT_FALSE(o);
  EXPECT_EQ(o.error().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(o.error().message().find("optimizer.type"), std::string::npos) << o.error().to_string();
  // fp32 working weights the trainer runs (in RAM between uses).
  o = trainer_options(parse({{"model", small_model()}, {"precision", "fp32"}}));
  ASSERT_TRUE(o) << o.error().to_string();
  EXPECT_EQ(o->precision, DType::kF32);
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
// The options it fills run the plan's placement (run_placement).
TEST(TrainerConfig, ThePlannersPlacementIsApplied) {
  strata::testing::TempDir dir;
  const GptRunConfig c =
      parse({{"model", {{"layers", 8}, {"hidden", 256}, {"heads", 4}, {"vocab", 256}, {"max_seq", 64}}},
             {"batch", {{"micro_batch", 4}, {"seq", 64}}}});
  Result<TrainerOptions> base = trainer_options(c);
  ASSERT_TRUE(base);
  TrainerOptions o = *base;
  Result<Plan> p = apply_planned_placement(&o, Budgets{4ull << 30, 4ull << 30, 0}, {}, {});
  ASSERT_TRUE(p) << p.error().to_string();
  EXPECT_EQ(run_placement(o), p->placement) << placement_text(p->placement);
  EXPECT_FALSE(o.stream_weights);
  EXPECT_EQ(o.states, Tier::kHost);
  EXPECT_EQ(o.device_bytes, 4ull << 30);  // the device budget holds resident too
  EXPECT_TRUE(o.nvme_paths.empty());

  o = *base;
  p = apply_planned_placement(&o, Budgets{24ull << 20, 4ull << 30, 0}, {}, {});
  ASSERT_TRUE(p) << p.error().to_string();
  EXPECT_EQ(run_placement(o), p->placement) << placement_text(p->placement);
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
  EXPECT_EQ(run_placement(o), p->placement) << placement_text(p->placement);
  EXPECT_EQ(o.states, Tier::kNvme);
  EXPECT_EQ(o.nvme_paths, std::vector<std::string>{dir.path()});
  // The config's constraints bind the planner.
  o = *base;
  Constraints fixed;
  fixed.states = Tier::kNvme;
  p = apply_planned_placement(&o, Budgets{4ull << 30, 4ull << 30, 0}, fixed, {dir.path()});
  ASSERT_TRUE(p) << p.error().to_string();
  EXPECT_EQ(run_placement(o), p->placement) << placement_text(p->placement);
  EXPECT_EQ(o.states, Tier::kNvme);
}

}  // namespace
}  // namespace strata::engine

namespace strata::engine {
namespace {

// Every leaf of `j` (dotted path -> pointer), objects and arrays included.
void leaves(json& j, std::vector<json*>* out) {
  out->push_back(&j);
  if (j.is_object()) {
    for (auto& [k, v] : j.items()) leaves(v, out);
  } else if (j.is_array()) {
    for (json& v : j) leaves(v, out);
  }
}

// Random mutations of valid configs (native and DeepSpeed) through the whole
// chain a user's file takes — parse, trainer options, the planner's
// placement, the printed plan — never crash or trip a sanitizer, and every
// refusal is an InvalidArgument, NotFound or ResourceExhausted with a
// message that names what was wrong (a key, a path, or what does not fit).
TEST(TrainerConfig, RandomlyMutatedConfigsAreRunOrRefusedWithAReason) {
  strata::testing::TempDir dir;
  const uint64_t seed = strata::testing::test_seed(211);
  const json bases[] = {
      {{"model", {{"layers", 4}, {"hidden", 128}, {"heads", 4}, {"vocab", 256}, {"max_seq", 64}}},
       {"batch", {{"micro_batch", 8}, {"seq", 64}, {"grad_accum", 2}}},
       {"budgets", {{"device", "64MiB"}, {"host", "4GiB"}, {"nvme", "8GiB"}}},
       {"nvme_paths", {dir.path()}},
       {"precision", "bf16"},
       {"states", "q8"},
       {"optimizer", {{"type", "adamw"}, {"lr", 3e-3}, {"betas", {0.9, 0.95}}, {"weight_decay", 0.01}}},
       {"gradient_clipping", 1.0},
       {"placement", {{"activations", "host"}, {"sub_group_size", 1 << 16}}},
       {"io", {{"backend", "posix"}, {"queue_depth", 8}, {"block_size", "1MiB"}}},
       {"seed", 7},
       {"steps", 10}},
      json::parse(R"({"train_batch_size": 4, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2,
        "gradient_clipping": 1.0, "fp16": {"enabled": true, "initial_scale_power": 12},
        "optimizer": {"type": "AdamW", "params": {"lr": 0.0001, "betas": [0.8, 0.999], "eps": 1e-8}},
        "zero_optimization": {"stage": 3, "sub_group_size": 1e6,
          "offload_optimizer": {"device": "nvme", "nvme_path": ")" +
                  dir.path() + R"(", "pin_memory": true, "buffer_count": 4},
          "offload_param": {"device": "cpu"}},
        "aio": {"block_size": 1048576, "queue_depth": 16}})")};
  const json values[] = {0,
                         1,
                         -1,
                         2,
                         1ll << 40,
                         1e300,
                         -0.5,
                         0.5,
                         "",
                         "abc",
                         "1GiB",
                         "-5MiB",
                         "1e999KiB",
                         true,
                         false,
                         nullptr,
                         json::array(),
                         json::object(),
                         json::array({1, 2}),
                         "nvme",
                         "host",
                         "device",
                         "cpu",
                         "fp16"};
  std::mt19937_64 rng(seed);
  int parsed = 0, planned = 0, refused = 0;
  for (int round = 0; round < 3000; ++round) {
    json j = bases[round % 2];
    const int mutations = rng() % 4 == 0 ? 2 : 1;
    for (int k = 0; k < mutations; ++k) {
      std::vector<json*> all;
      leaves(j, &all);
      json* at = all[rng() % all.size()];
      const uint64_t what = rng() % 8;
      if (what == 0 && at->is_object() && !at->empty()) {
        auto it = at->begin();
        std::advance(it, static_cast<std::ptrdiff_t>(rng() % at->size()));
        at->erase(it.key());
      } else if (what == 1 && at->is_object()) {
        (*at)["unknown_" + std::to_string(k)] = values[rng() % std::size(values)];
      } else {
        *at = values[rng() % std::size(values)];
      }
    }
    SCOPED_TRACE(j.dump());
    std::vector<std::string> warnings;
    Status why;
    Result<GptRunConfig> run = parse_gpt_config(j, &warnings);
    if (run) {
      ++parsed;
      const EngineConfig* c = &run->engine;
      Result<TrainerOptions> o = trainer_options(*run);
      if (o) {
        Result<Plan> p = apply_planned_placement(&*o, budgets_or_defaults(c->budgets), c->constraints, c->nvme_paths);
        if (p) {
          ++planned;
          EXPECT_FALSE(format_plan(*p, budgets_or_defaults(c->budgets)).empty());
          EXPECT_TRUE(check_state_piece_elems(o->state_piece_elems).ok());
          continue;
        }
        why = p.status();
      } else {
        why = o.status();
      }
    } else {
      why = run.status();
    }
    ++refused;
    EXPECT_TRUE(why.code() == StatusCode::kInvalidArgument || why.code() == StatusCode::kNotFound ||
                why.code() == StatusCode::kResourceExhausted)
        << why.to_string();
    EXPECT_GT(why.message().size(), 10u) << why.to_string();
  }
  std::printf("mutated configs: %d parsed, %d planned, %d refused\n", parsed, planned, refused);
  EXPECT_GT(planned, 100);
  EXPECT_GT(refused, 100);
}

// Issue 29: "speculate_in_ram": true was overridden by the planner without
// a word. Planned, it is kept; where the plan drops it (states on NVMe, or
// no room for the second copy) a warning names the key and why.
// The "session" keys are a session's: the trainer says it ignores them.
TEST(TrainerConfig, SessionKeysAreAWarningNotSilence) {
  const GptRunConfig c = parse({{"session", {{"prefetch_depth", 3}, {"resident_first", true}}}});
  EXPECT_EQ(c.engine.session.prefetch_depth, 3);
  EXPECT_TRUE(c.engine.session.resident_first);
  std::vector<std::string> warnings;
  Result<TrainerOptions> o = trainer_options(c, &warnings);
  ASSERT_TRUE(o);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("config key session"), std::string::npos) << warnings[0];
  warnings.clear();
  ASSERT_TRUE(trainer_options(parse(nlohmann::json::object()), &warnings));
  EXPECT_TRUE(warnings.empty());
}

TEST(TrainerConfig, ASpeculationThePlanDropsIsAWarningNotSilence) {
  strata::testing::TempDir dir;
  const GptRunConfig c =
      parse({{"model", {{"layers", 8}, {"hidden", 256}, {"heads", 4}, {"vocab", 256}, {"max_seq", 64}}},
             {"batch", {{"micro_batch", 4}, {"seq", 64}}},
             {"speculate_in_ram", true}});
  Result<TrainerOptions> base = trainer_options(c);
  ASSERT_TRUE(base);
  ASSERT_TRUE(base->speculate_in_ram);
  // Room for one copy of the states in RAM and not two.
  TrainerOptions o = *base;
  const Plan one = estimate(training_setup(o), {Tier::kDevice, Tier::kHost, Tier::kDevice, 1}, Bandwidths{});
  std::vector<std::string> warnings;
  Result<Plan> p = apply_planned_placement(&o, Budgets{4ull << 30, one.host.total(), 0}, {}, {}, &warnings);
  ASSERT_TRUE(p) << p.error().to_string();
  EXPECT_FALSE(o.speculate_in_ram);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("config key speculate_in_ram: true is not honoured"), std::string::npos) << warnings[0];
  // States on NVMe (fixed there): said too, with that reason.
  o = *base;
  warnings.clear();
  Constraints fixed;
  fixed.states = Tier::kNvme;
  p = apply_planned_placement(&o, Budgets{4ull << 30, 4ull << 30, 0}, fixed, {dir.path()}, &warnings);
  ASSERT_TRUE(p) << p.error().to_string();
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("on NVMe"), std::string::npos) << warnings[0];
  // Room for both and faster: kept, nothing said.
  o = *base;
  warnings.clear();
  p = apply_planned_placement(&o, Budgets{4ull << 30, 4ull << 30, 0}, {}, {}, &warnings);
  ASSERT_TRUE(p) << p.error().to_string();
  if (p->placement.speculate_in_ram) {
    EXPECT_TRUE(o.speculate_in_ram);
    EXPECT_TRUE(warnings.empty()) << warnings.front();
  } else {
    EXPECT_EQ(warnings.size(), 1u) << "dropped, so said";
  }
}

// The GPT's own keys: a preset, then its shape key by key, and batch.seq;
// what the GPT cannot take is refused naming the key.
TEST(TrainerConfig, TheGptReadsItsKeysAndRefusesByName) {
  Result<GptRunConfig> c = parse_gpt_config(
      json{{"model", {{"preset", "gpt2-medium"}, {"max_seq", 512}}}, {"batch", {{"micro_batch", 4}, {"seq", 512}}}},
      nullptr);
  ASSERT_TRUE(c) << c.error().to_string();
  EXPECT_EQ(c->gpt.model.layers, 24);
  EXPECT_EQ(c->gpt.model.hidden, 1024);
  EXPECT_EQ(c->gpt.model.max_seq, 512);
  EXPECT_EQ(c->gpt.seq, 512);
  EXPECT_EQ(c->engine.setup.micro_batch, 4);
  Result<GptRunConfig> defaults = parse_gpt_config(json::object(), nullptr);
  ASSERT_TRUE(defaults);
  EXPECT_EQ(defaults->gpt.model.layers, 12) << "GPT-2 small";
  EXPECT_EQ(defaults->gpt.seq, 1024);
  auto error_of = [](const json& j) {
    Result<GptRunConfig> r = parse_gpt_config(j, nullptr);
    return r ? std::string("parsed") : r.error().to_string();
  };
  std::string m = error_of({{"model", {{"hidden", 100}, {"heads", 7}}}});
  EXPECT_NE(m.find("config key model"), std::string::npos) << m;
  EXPECT_NE(m.find("heads"), std::string::npos) << m;
  m = error_of({{"model", {{"max_seq", 64}}}, {"batch", {{"seq", 128}}}});
  EXPECT_NE(m.find("config key batch.seq: 128 exceeds model.max_seq 64"), std::string::npos) << m;
  m = error_of({{"model", {{"preset", "gpt3"}}}});
  EXPECT_NE(m.find("config key model.preset: expected one of gpt2-small"), std::string::npos) << m;
}

// docs/CONFIG.md documents exactly the keys read: the engine's and the
// built-in GPT's (the only model that reads config keys). The configs
// below enter every object and branch of the parser (each object present,
// empty), and the union of the keys asked about must equal the keys in the
// reference's tables (`| `key` | ...` rows).
TEST(TrainerConfig, TheReferenceDocumentsExactlyTheKeysTheParserReads) {
  const std::vector<json> walks = {
      json::parse(R"({"model": {}, "batch": {}, "budgets": {}, "placement": {}, "io": {}, "schedule": {}, "session": {},
                      "optimizer": {"type": "Adam", "params": {}}})"),
      json::parse(R"({"fp16": {}, "bf16": {}, "aio": {}, "zero_optimization": {"offload_optimizer": {},
                      "offload_param": {}}, "scheduler": {"type": "WarmupDecayLR", "params": {}}, "steps": 5000})"),
      json::parse(R"({"scheduler": {"type": "WarmupCosineLR", "params": {}}, "steps": 5000})"),
      json::parse(R"({"optimizer": {}})"),
  };
  std::set<std::string> asked;
  for (const json& j : walks) {
    Result<GptRunConfig> c = parse_gpt_config(j, nullptr, {}, &asked);
    EXPECT_TRUE(c) << j.dump() << ": " << c.error().to_string();
  }
  std::ifstream doc(std::string(STRATA_SOURCE_DIR) + "/docs/CONFIG.md");
  ASSERT_TRUE(doc) << "docs/CONFIG.md";
  std::set<std::string> documented;
  for (std::string line; std::getline(doc, line);) {
    if (line.rfind("| `", 0) != 0) continue;
    const size_t end = line.find('`', 3);
    if (end != std::string::npos) documented.insert(line.substr(3, end - 3));
  }
  for (const std::string& k : asked) {
    EXPECT_TRUE(documented.count(k)) << "config key " << k << " is read by the parser but not in docs/CONFIG.md";
  }
  for (const std::string& k : documented) {
    EXPECT_TRUE(asked.count(k)) << "docs/CONFIG.md documents " << k << ", which the parser does not read";
  }
}

}  // namespace
}  // namespace strata::engine
