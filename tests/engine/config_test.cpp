#include "engine/config.h"

#include <gtest/gtest.h>
#include <sys/statvfs.h>

#include <fstream>
#include <set>
#include <nlohmann/json.hpp>

#include "common/units.h"
#include "tests/test_util.h"

namespace strata::engine {
namespace {

using nlohmann::json;

bool contains(const std::vector<std::string>& v, const std::string& needle) {
  for (const std::string& s : v) {
    if (s.find(needle) != std::string::npos) return true;
  }
  return false;
}

TEST(Config, NativeConfigParsesEveryField) {
  strata::testing::TempDir dir;
  json j = {{"batch", {{"micro_batch", 4}, {"grad_accum", 8}, {"vertical", true}}},
            {"budgets", {{"device", "24GiB"}, {"host", "64GiB"}, {"nvme", "1TiB"}}},
            {"nvme_paths", {dir.path()}},
            {"precision", "fp16"},
            {"states", "q8"},
            {"optimizer", {{"type", "adamw"}, {"lr", 3e-4}, {"betas", {0.9, 0.95}}, {"weight_decay", 0.1}}},
            {"gradient_clipping", 1.0},
            {"placement",
             {{"activations", "host"}, {"gradients", "nvme"}, {"gradient_buffers", 5}, {"sub_group_size", 1 << 20}}},
            {"io", {{"backend", "posix"}, {"queue_depth", 64}, {"block_size", "8MiB"}}},
            {"seed", 7},
            {"speculate_in_ram", true},
            {"numa_node", 1},
            {"pin_memory", false},
            {"steps", 100}};
  std::vector<std::string> warnings;
  Result<EngineConfig> c = parse_config(j, &warnings);
  ASSERT_TRUE(c) << c.error().to_string();
  EXPECT_TRUE(warnings.empty()) << warnings.front();
  EXPECT_EQ(c->setup.micro_batch, 4);
  EXPECT_EQ(c->setup.grad_accum, 8);
  EXPECT_TRUE(c->vertical_accumulation);
  EXPECT_EQ(c->setup.compute, DType::kF16);
  EXPECT_NEAR(c->setup.state_bytes_per_param, 2.03125, 1e-12);
  EXPECT_EQ(c->adam_states, cpu_optim::StateType::kQ8);
  EXPECT_EQ(c->budgets.device_bytes, 24 * kGiB);
  EXPECT_EQ(c->budgets.nvme_bytes, 1024 * kGiB);
  EXPECT_TRUE(c->nvme_budget_given);
  EXPECT_DOUBLE_EQ(c->optimizer.beta2, 0.95);
  EXPECT_EQ(c->constraints.activations, Tier::kHost);
  EXPECT_EQ(c->constraints.gradients, Tier::kNvme);
  EXPECT_EQ(c->setup.gradient_buffers, 5);
  EXPECT_EQ(c->setup.state_piece_elems, 1 << 20);
  EXPECT_FALSE(c->constraints.weights.has_value());
  EXPECT_EQ(c->io.block_bytes, 8 * kMiB);
  EXPECT_EQ(c->seed, 7u);
  EXPECT_TRUE(c->speculate_in_ram);
  EXPECT_EQ(c->numa_node, 1);
  EXPECT_FALSE(c->pin_memory);
}

// A model's keys ("model", and its own in "batch") are the model's to
// read, with the engine's reader: its values, its errors naming the key,
// the keys it leaves unread warned about, an absent object read as empty.
// With no model to read them, a "model" object is a warning.
TEST(Config, AModelReadsItsOwnKeysWithTheEnginesReader) {
  struct Toy {
    int64_t width = 8, tokens = 4;
  };
  auto keys_of = [](Toy* toy) -> ModelKeys {
    return [toy](ConfigReader& model, ConfigReader& batch) -> Status {
      STRATA_RETURN_IF_ERROR(model.get_int("width", &toy->width, 1, 64));
      return batch.get_int("tokens", &toy->tokens, 1, 1 << 20);
    };
  };
  const json j = {{"model", {{"width", 32}, {"depth", 3}}}, {"batch", {{"micro_batch", 2}, {"tokens", 16}}}};
  Toy toy;
  std::vector<std::string> warnings;
  std::set<std::string> asked;
  Result<EngineConfig> c = parse_config(j, &warnings, {}, &asked, keys_of(&toy));
  ASSERT_TRUE(c) << c.error().to_string();
  EXPECT_EQ(toy.width, 32);
  EXPECT_EQ(toy.tokens, 16);
  EXPECT_EQ(c->setup.micro_batch, 2);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_EQ(warnings[0], "unknown key model.depth ignored");
  EXPECT_TRUE(asked.count("model.width") && asked.count("batch.tokens"));

  Toy absent;
  asked.clear();
  ASSERT_TRUE(parse_config(json::object(), nullptr, {}, &asked, keys_of(&absent)));
  EXPECT_EQ(absent.width, 8) << "an absent object keeps the model's defaults";
  EXPECT_TRUE(asked.count("model.width") && asked.count("batch.tokens")) << "and its keys are still asked about";

  Toy bad;
  Result<EngineConfig> refused = parse_config(json{{"model", {{"width", 100}}}}, nullptr, {}, nullptr, keys_of(&bad));
  ASSERT_FALSE(refused);
  EXPECT_NE(refused.error().message().find("config key model.width: expected an integer in 1..64, got 100"),
            std::string::npos)
      << refused.error().to_string();

  warnings.clear();
  ASSERT_TRUE(parse_config(j, &warnings));
  ASSERT_EQ(warnings.size(), 2u);
  EXPECT_TRUE(contains(warnings, "model: this run's model reads no config keys")) << warnings[0];
  EXPECT_TRUE(contains(warnings, "unknown key batch.tokens ignored")) << warnings[1];
}

// A DeepSpeed ZeRO-Infinity config, unchanged.
TEST(Config, DeepSpeedOffloadSubsetIsAcceptedUnchanged) {
  strata::testing::TempDir dir;
  json j = json::parse(R"({
    "train_batch_size": 16,
    "train_micro_batch_size_per_gpu": 2,
    "gradient_accumulation_steps": 8,
    "gradient_clipping": 1.0,
    "steps_per_print": 10,
    "fp16": {"enabled": true, "loss_scale": 0, "initial_scale_power": 12, "loss_scale_window": 500,
             "hysteresis": 2, "min_loss_scale": 1},
    "optimizer": {"type": "AdamW", "params": {"lr": 0.0001, "betas": [0.8, 0.999], "eps": 1e-8,
                                                "weight_decay": 0.01}},
    "zero_optimization": {
      "stage": 3,
      "offload_optimizer": {"device": "nvme", "nvme_path": ")" + dir.path() + R"(", "pin_memory": true,
                            "buffer_count": 4, "fast_init": false},
      "offload_param": {"device": "cpu", "pin_memory": true},
      "stage3_max_live_parameters": 1e9,
      "sub_group_size": 1e8
    },
    "aio": {"block_size": 1048576, "queue_depth": 16, "thread_count": 1, "single_submit": false,
            "overlap_events": true}
  })");
  std::vector<std::string> warnings;
  Result<EngineConfig> c = parse_config(j, &warnings);
  ASSERT_TRUE(c) << c.error().to_string();
  EXPECT_EQ(c->setup.micro_batch, 2);
  EXPECT_EQ(c->setup.grad_accum, 8);
  EXPECT_EQ(c->setup.compute, DType::kF16);
  EXPECT_EQ(c->loss_scaling.initial_scale_power, 12);
  EXPECT_EQ(c->loss_scaling.window, 500);
  EXPECT_EQ(c->optimizer.type, "adamw");
  EXPECT_DOUBLE_EQ(c->optimizer.beta1, 0.8);
  EXPECT_DOUBLE_EQ(c->gradient_clipping, 1.0);
  EXPECT_EQ(c->constraints.states, Tier::kNvme);
  EXPECT_EQ(c->constraints.weights, Tier::kHost);
  ASSERT_EQ(c->nvme_paths.size(), 1u);
  EXPECT_GT(c->budgets.nvme_bytes, 0u);  // the free space of nvme_path
  EXPECT_FALSE(c->nvme_budget_given);
  EXPECT_EQ(c->io.queue_depth, 16u);
  EXPECT_EQ(c->setup.state_piece_elems, 100000000);  // written as a float, as DeepSpeed's examples do
  // Unknown keys are named; understood-but-unused ones say why.
  EXPECT_TRUE(contains(warnings, "unknown key zero_optimization.stage3_max_live_parameters")) << warnings.size();
  EXPECT_TRUE(contains(warnings, "unknown key steps_per_print"));
  EXPECT_TRUE(contains(warnings, "zero_optimization.offload_optimizer.buffer_count: the planner"));
  EXPECT_FALSE(contains(warnings, "pin_memory")) << "pin_memory is used, not ignored";
  EXPECT_TRUE(c->pin_memory);
  EXPECT_TRUE(contains(warnings, "aio.thread_count"));
  // DeepSpeed's pin_memory: false turns locking off.
  json unpinned = j;
  unpinned["zero_optimization"]["offload_optimizer"]["pin_memory"] = false;
  Result<EngineConfig> u = parse_config(unpinned, nullptr);
  ASSERT_TRUE(u) << u.error().to_string();
  EXPECT_FALSE(u->pin_memory);
}

TEST(Config, InvalidValuesNameTheKeyAndWhatIsAllowed) {
  auto error_of = [](const json& j) {
    Result<EngineConfig> c = parse_config(j, nullptr);
    EXPECT_FALSE(c);
    return c ? std::string() : std::string(c.error().message());
  };
  std::string m = error_of({{"precision", "fp8"}});
  EXPECT_NE(m.find("precision"), std::string::npos);
  EXPECT_NE(m.find("one of bf16, fp16, fp32"), std::string::npos) << m;
  m = error_of({{"batch", {{"micro_batch", 0}}}});
  EXPECT_NE(m.find("batch.micro_batch"), std::string::npos) << m;
  m = error_of({{"budgets", {{"device", "lots"}}}});
  EXPECT_NE(m.find("budgets.device"), std::string::npos) << m;
  m = error_of({{"zero_optimization", {{"offload_optimizer", {{"device", "nvme"}}}}}});
  EXPECT_NE(m.find("zero_optimization.offload_optimizer.nvme_path is required"), std::string::npos) << m;
  m = error_of({{"zero_optimization", {{"offload_param", {{"device", "gpu"}}}}}});
  EXPECT_NE(m.find("one of cpu, nvme, none"), std::string::npos) << m;
  m = error_of({{"optimizer", {{"params", {{"betas", {0.9}}}}}}});
  EXPECT_NE(m.find("optimizer.params.betas"), std::string::npos) << m;
  m = error_of({{"train_batch_size", 10}, {"train_micro_batch_size_per_gpu", 4}});
  EXPECT_NE(m.find("train_batch_size: 10 is not a multiple of train_micro_batch_size_per_gpu (4)"), std::string::npos)
      << m;
  m = error_of({{"train_batch_size", 10}, {"train_micro_batch_size_per_gpu", 5}, {"gradient_accumulation_steps", 3}});
  EXPECT_NE(m.find("train_batch_size: 10 != train_micro_batch_size_per_gpu x gradient_accumulation_steps (15)"),
            std::string::npos)
      << m;
  m = error_of({{"fp16", {{"enabled", true}}}, {"bf16", {{"enabled", true}}}});
  EXPECT_NE(m.find("pick one"), std::string::npos) << m;
  m = error_of({{"nvme_paths", {"/nonexistent-strata"}}});
  EXPECT_NE(m.find("/nonexistent-strata"), std::string::npos) << m;
  m = error_of({{"placement", {{"gradients", "device"}}}});
  EXPECT_NE(m.find("placement.gradients"), std::string::npos) << m;
  m = error_of({{"placement", {{"gradient_buffers", 0}}}});
  EXPECT_NE(m.find("placement.gradient_buffers"), std::string::npos) << m;
  m = error_of({{"placement", {{"sub_group_size", 100}}}});
  EXPECT_NE(m.find("placement.sub_group_size: 100 parameters; 0 (whole chunks) or at least 4096"), std::string::npos)
      << m;
  m = error_of({{"zero_optimization", {{"sub_group_size", 1.5e4 + 0.5}}}});
  EXPECT_NE(m.find("zero_optimization.sub_group_size"), std::string::npos) << m;
  m = error_of({{"numa_node", -2}});
  EXPECT_NE(m.find("numa_node"), std::string::npos) << m;
  m = error_of(json::array());
  EXPECT_NE(m.find("JSON object"), std::string::npos);
}

TEST(Config, FilesAreReadWithCommentsAndErrorsNameThem) {
  strata::testing::TempDir dir;
  std::string path = dir.path() + "/c.json";
  std::ofstream(path) << "{\n  // a comment\n  \"batch\": {\"micro_batch\": 3}, \"typo_key\": 1\n}\n";
  std::vector<std::string> warnings;
  Result<EngineConfig> c = load_config(path, &warnings);
  ASSERT_TRUE(c) << c.error().to_string();
  EXPECT_EQ(c->setup.micro_batch, 3);
  EXPECT_TRUE(contains(warnings, "unknown key typo_key"));
  EXPECT_EQ(load_config(dir.path() + "/missing.json", nullptr).error().code(), StatusCode::kNotFound);
  std::ofstream(dir.path() + "/bad.json") << "{ not json";
  Result<EngineConfig> bad = load_config(dir.path() + "/bad.json", nullptr);
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().message().find("bad.json"), std::string::npos);
}

// placement.activations was placement.checkpoints: the old name is read
// with a warning saying so, and both at once are refused.
TEST(Config, TheOldNameOfPlacementActivationsIsReadWithAWarning) {
  std::vector<std::string> warnings;
  Result<EngineConfig> c = parse_config(json{{"placement", {{"checkpoints", "host"}}}}, &warnings);
  ASSERT_TRUE(c) << c.error().to_string();
  ASSERT_TRUE(c->constraints.activations.has_value());
  EXPECT_EQ(*c->constraints.activations, Tier::kHost);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_EQ(warnings[0], "placement.checkpoints is the old name of placement.activations; read as it");
  Result<EngineConfig> both =
      parse_config(json{{"placement", {{"checkpoints", "host"}, {"activations", "host"}}}}, &warnings);
  ASSERT_FALSE(both);
  EXPECT_EQ(both.error().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(both.error().message().find("its old name"), std::string::npos) << both.error().to_string();
}

// An NVMe budget or placement with no NVMe directory named is refused,
// saying where one may come from; a command line's directory (strata-train
// --nvme DIR) serves a config that names none, and not one that does.
TEST(Config, NvmeKeysTakeTheCommandLinesDirectoryWhenTheConfigNamesNone) {
  strata::testing::TempDir dir;
  const json j = {{"budgets", {{"nvme", "1GiB"}}}, {"placement", {{"gradients", "nvme"}, {"states", "nvme"}}}};
  Result<EngineConfig> none = parse_config(j, nullptr);
  ASSERT_FALSE(none);
  EXPECT_NE(none.error().message().find("strata-train --nvme DIR"), std::string::npos) << none.error().to_string();
  Result<EngineConfig> given = parse_config(j, nullptr, {dir.path()});
  ASSERT_TRUE(given) << given.error().to_string();
  EXPECT_EQ(given->nvme_paths, std::vector<std::string>{dir.path()});
  EXPECT_EQ(given->budgets.nvme_bytes, kGiB);
  json own = j;
  own["nvme_paths"] = {dir.sub("own")};
  Result<EngineConfig> kept = parse_config(own, nullptr, {dir.path()});
  ASSERT_TRUE(kept) << kept.error().to_string();
  EXPECT_EQ(kept->nvme_paths, std::vector<std::string>{dir.path() + "/own"});
}

// The default NVMe budget is what the swap store can place: every blob is
// striped over all the directories in equal units, so the one with the
// least room bounds them, and directories on one filesystem share its free
// space.
TEST(Config, TheDefaultNvmeBudgetIsWhatTheStripesCanUse) {
  strata::testing::TempDir dir;
  const std::string a = dir.sub("a"), b = dir.sub("b");
  auto available = [](const std::string& path) {
    struct statvfs st {};
    EXPECT_EQ(::statvfs(path.c_str(), &st), 0) << path;
    return static_cast<uint64_t>(st.f_bavail) * st.f_frsize;
  };
  Result<uint64_t> one = nvme_free_bytes({a});
  ASSERT_TRUE(one) << one.error().to_string();
  EXPECT_GT(*one, 0u);
  // Two directories on one filesystem: its free space once, not twice (the
  // filesystem's other users may change it a little between the calls).
  Result<uint64_t> two = nvme_free_bytes({a, b});
  ASSERT_TRUE(two) << two.error().to_string();
  EXPECT_LT(*two, *one + 64 * kMiB);
  EXPECT_GT(*two + 64 * kMiB, *one);
  EXPECT_EQ(*nvme_free_bytes({}), 0u);
  Result<uint64_t> missing = nvme_free_bytes({a, dir.path() + "/missing"});
  ASSERT_FALSE(missing);
  EXPECT_EQ(missing.error().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.error().message().find(dir.path() + "/missing"), std::string::npos);
  // A small disk beside a big one: the stripes fill the small one first.
  strata::testing::SmallDisk disk(dir.path(), 16 * kMiB);
  if (!disk.skip_reason().empty()) GTEST_SKIP() << disk.skip_reason();
  const uint64_t small = available(disk.mount_point());
  ASSERT_LT(small, *one);
  EXPECT_EQ(*nvme_free_bytes({a, disk.mount_point()}), 2 * small);
  // The config's budget when it names none, and its warning saying so.
  std::vector<std::string> warnings;
  Result<EngineConfig> c = parse_config(json{{"nvme_paths", {disk.mount_point(), a}}}, &warnings);
  ASSERT_TRUE(c) << c.error().to_string();
  EXPECT_FALSE(c->nvme_budget_given);
  EXPECT_EQ(c->budgets.nvme_bytes, 2 * small);
  EXPECT_TRUE(contains(warnings, "budgets.nvme not given"));
}

// Hugging Face's Trainer writes "auto" into DeepSpeed configs and fills it in
// before DeepSpeed reads them: such a key counts as absent (strata's
// default), with a warning naming it; any other string is still refused.
TEST(Config, AutoValuesKeepTheDefaultsAndAreNamed) {
  std::vector<std::string> warnings;
  const EngineConfig defaults = *parse_config(json::object(), &warnings);
  warnings.clear();
  json j = {
      {"bf16", {{"enabled", "auto"}}},
      {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", "auto"}, {"betas", "auto"}, {"weight_decay", 0.05}}}}},
      {"zero_optimization", {{"stage", 3}, {"offload_param", {{"device", "cpu"}}}, {"reduce_bucket_size", "auto"}}},
      {"gradient_accumulation_steps", "auto"},
      {"gradient_clipping", "auto"},
      {"train_micro_batch_size_per_gpu", "auto"}};
  Result<EngineConfig> c = parse_config(j, &warnings);
  ASSERT_TRUE(c) << c.error().to_string();
  EXPECT_DOUBLE_EQ(c->optimizer.lr, defaults.optimizer.lr);
  EXPECT_DOUBLE_EQ(c->optimizer.beta1, defaults.optimizer.beta1);
  EXPECT_DOUBLE_EQ(c->optimizer.weight_decay, 0.05);  // a number beside them is read
  EXPECT_EQ(c->setup.grad_accum, defaults.setup.grad_accum);
  EXPECT_EQ(c->setup.micro_batch, defaults.setup.micro_batch);
  EXPECT_DOUBLE_EQ(c->gradient_clipping, defaults.gradient_clipping);
  EXPECT_EQ(c->setup.compute, defaults.setup.compute);
  EXPECT_EQ(c->constraints.weights, Tier::kHost);
  for (const char* key : {"optimizer.params.lr", "optimizer.params.betas", "gradient_accumulation_steps",
                          "gradient_clipping", "train_micro_batch_size_per_gpu", "bf16.enabled"}) {
    EXPECT_TRUE(contains(warnings, std::string(key) + ": \"auto\"")) << key;
  }
  EXPECT_FALSE(contains(warnings, "optimizer.params.weight_decay"));
  EXPECT_TRUE(contains(warnings, "DeepSpeed would train in fp32, strata computes in bf16"));
  // Not a placeholder: still an error naming the key.
  Result<EngineConfig> bad = parse_config(json{{"gradient_clipping", "automatic"}}, &warnings);
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().message().find("gradient_clipping"), std::string::npos) << bad.error().to_string();
}

// Issue 31: "auto" is one of io.backend's own values, not a placeholder:
// taken as given, with no warning about Hugging Face.
TEST(Config, AutoIsAValueWhereTheKeyAllowsIt) {
  std::vector<std::string> warnings;
  Result<EngineConfig> c = parse_config(json{{"io", {{"backend", "auto"}}}}, &warnings);
  ASSERT_TRUE(c) << c.error().to_string();
  EXPECT_EQ(c->io.backend, "auto");
  EXPECT_TRUE(warnings.empty()) << warnings.front();
  Result<EngineConfig> posix = parse_config(json{{"io", {{"backend", "posix"}}}}, &warnings);
  ASSERT_TRUE(posix);
  EXPECT_EQ(posix->io.backend, "posix");
}

// Issue 31: a budget of 0 was read as "not given" and replaced by a default
// (a 1 GiB device, half the RAM, the disk's free space): refused, naming
// the key.
TEST(Config, ABudgetOfZeroIsRefusedNotDefaulted) {
  for (const char* key : {"device", "host", "nvme"}) {
    for (const json& zero : {json(0), json("0"), json("0GiB")}) {
      json j = {{"budgets", {{key, zero}}}};
      Result<EngineConfig> c = parse_config(j, nullptr);
      ASSERT_FALSE(c) << key << " = " << zero.dump();
      EXPECT_EQ(c.error().code(), StatusCode::kInvalidArgument);
      const std::string m(c.error().message());
      EXPECT_NE(m.find(std::string("budgets.") + key), std::string::npos) << m;
      EXPECT_NE(m.find("at least 1"), std::string::npos) << m;
    }
  }
  Result<EngineConfig> one = parse_config(json{{"budgets", {{"device", 1}}}}, nullptr);
  ASSERT_TRUE(one) << one.error().to_string();
  EXPECT_EQ(one->budgets.device_bytes, 1u);
}

// DeepSpeed's batch rule on one GPU: given two of train_batch_size, the
// micro-batch and the accumulation steps, the third follows.
TEST(Config, DeepSpeedDerivesTheThirdBatchSize) {
  struct Case {
    json keys;
    int64_t micro, accum;
  };
  const std::vector<Case> cases = {
      {{{"train_batch_size", 32}, {"train_micro_batch_size_per_gpu", 4}}, 4, 8},
      {{{"train_batch_size", 32}, {"gradient_accumulation_steps", 2}}, 16, 2},
      {{{"train_batch_size", 6}}, 6, 1},
      {{{"train_micro_batch_size_per_gpu", 3}, {"gradient_accumulation_steps", 5}}, 3, 5},
      {{{"train_batch_size", 12}, {"train_micro_batch_size_per_gpu", 3}, {"gradient_accumulation_steps", 4}}, 3, 4},
      {{{"train_batch_size", 32}, {"train_micro_batch_size_per_gpu", 4}, {"gradient_accumulation_steps", "auto"}},
       4,
       8},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.keys.dump());
    std::vector<std::string> warnings;
    Result<EngineConfig> cfg = parse_config(c.keys, &warnings);
    ASSERT_TRUE(cfg) << cfg.error().to_string();
    EXPECT_EQ(cfg->setup.micro_batch, c.micro);
    EXPECT_EQ(cfg->setup.grad_accum, c.accum);
  }
}

// DeepSpeed's Adam is AdamW unless its params say adam_w_mode: false (its
// runtime/config.py: ADAM_W_MODE_DEFAULT = True); strata's own "adam" (no
// params block) is torch.optim.Adam, decay coupled.
TEST(Config, DeepSpeedsAdamIsAdamWUnlessAdamWModeIsFalse) {
  auto type_of = [](const json& optimizer) {
    std::vector<std::string> warnings;
    Result<EngineConfig> c = parse_config(json{{"optimizer", optimizer}}, &warnings);
    EXPECT_TRUE(c) << c.error().to_string();
    return c ? c->optimizer.type : std::string();
  };
  EXPECT_EQ(type_of({{"type", "Adam"}, {"params", {{"lr", 1e-3}, {"weight_decay", 0.01}}}}), "adamw");
  EXPECT_EQ(type_of({{"type", "adam"}, {"params", {{"lr", 1e-3}, {"torch_adam", true}}}}), "adamw");
  EXPECT_EQ(type_of({{"type", "Adam"}, {"params", {{"adam_w_mode", false}}}}), "adam");
  EXPECT_EQ(type_of({{"type", "AdamW"}, {"params", {{"adam_w_mode", false}}}}), "adamw");  // as DeepSpeed
  EXPECT_EQ(type_of({{"type", "adam"}, {"lr", 1e-3}}), "adam");
  Result<EngineConfig> bad =
      parse_config(json{{"optimizer", {{"type", "Adam"}, {"params", {{"adam_w_mode", "yes"}}}}}}, nullptr);
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().message().find("optimizer.params.adam_w_mode"), std::string::npos) << bad.error().to_string();
}

// The rate step by step: strata's "schedule", and DeepSpeed's three
// warmup schedulers with their defaults (log warmup over 1000 steps).
TEST(Config, SchedulesNativeAndDeepSpeeds) {
  std::vector<std::string> warnings;
  Result<EngineConfig> c = parse_config(json{{"optimizer", {{"type", "adamw"}, {"lr", 0.01}}},
                                             {"schedule",
                                              {{"warmup_steps", 10},
                                               {"start_lr", 0.001},
                                               {"decay", "cosine"},
                                               {"decay_end_step", 100},
                                               {"end_lr", 0.0005}}}},
                                        &warnings);
  ASSERT_TRUE(c) << c.error().to_string();
  EXPECT_EQ(c->lr_schedule.warmup_steps, 10);
  EXPECT_EQ(c->lr_schedule.warmup, LrSchedule::Warmup::kLinear);
  EXPECT_EQ(c->lr_schedule.decay, LrSchedule::Decay::kCosine);
  EXPECT_DOUBLE_EQ(lr_at(c->lr_schedule, c->optimizer.lr, 1), 0.001);
  EXPECT_DOUBLE_EQ(lr_at(c->lr_schedule, c->optimizer.lr, 11), 0.01);
  EXPECT_DOUBLE_EQ(lr_at(c->lr_schedule, c->optimizer.lr, 101), 0.0005);

  // WarmupLR: the peak is warmup_max_lr, whatever the optimizer says.
  c = parse_config(json{{"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 0.5}}}}},
                        {"scheduler",
                         {{"type", "WarmupLR"},
                          {"params", {{"warmup_min_lr", 0}, {"warmup_max_lr", 0.002}, {"warmup_num_steps", 50}}}}}},
                   &warnings);
  ASSERT_TRUE(c) << c.error().to_string();
  EXPECT_DOUBLE_EQ(c->optimizer.lr, 0.002);
  EXPECT_EQ(c->lr_schedule.warmup, LrSchedule::Warmup::kLog);  // DeepSpeed's default warmup_type
  EXPECT_EQ(c->lr_schedule.decay, LrSchedule::Decay::kConstant);
  EXPECT_DOUBLE_EQ(lr_at(c->lr_schedule, c->optimizer.lr, 50), 0.002);
  EXPECT_LT(lr_at(c->lr_schedule, c->optimizer.lr, 10), 0.002);
  // WarmupDecayLR: back down to warmup_min_lr at total_num_steps.
  c = parse_config(json{{"scheduler",
                         {{"type", "WarmupDecayLR"},
                          {"params",
                           {{"warmup_min_lr", 1e-5},
                            {"warmup_max_lr", 1e-3},
                            {"warmup_num_steps", 10},
                            {"total_num_steps", 110},
                            {"warmup_type", "linear"}}}}}},
                   &warnings);
  ASSERT_TRUE(c) << c.error().to_string();
  EXPECT_EQ(c->lr_schedule.decay, LrSchedule::Decay::kLinear);
  EXPECT_DOUBLE_EQ(lr_at(c->lr_schedule, c->optimizer.lr, 1), 1e-5);
  EXPECT_NEAR(lr_at(c->lr_schedule, c->optimizer.lr, 111), 1e-5, 1e-15);
  // WarmupCosineLR: ratios of the optimizer's lr; 1000 warmup steps unless said.
  c = parse_config(
      json{
          {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 0.004}}}}},
          {"scheduler", {{"type", "WarmupCosineLR"}, {"params", {{"total_num_steps", 5000}, {"cos_min_ratio", 0.1}}}}}},
      &warnings);
  ASSERT_TRUE(c) << c.error().to_string();
  EXPECT_EQ(c->lr_schedule.warmup_steps, 1000);
  EXPECT_EQ(c->lr_schedule.decay, LrSchedule::Decay::kCosine);
  EXPECT_DOUBLE_EQ(c->lr_schedule.start_lr, 0.0);
  EXPECT_NEAR(lr_at(c->lr_schedule, c->optimizer.lr, 5001), 0.0004, 1e-15);

  auto error_of = [](const json& j) {
    Result<EngineConfig> r = parse_config(j, nullptr);
    EXPECT_FALSE(r);
    return r ? std::string() : std::string(r.error().message());
  };
  std::string m = error_of({{"scheduler", {{"type", "OneCycle"}}}});
  EXPECT_NE(m.find("scheduler.type"), std::string::npos) << m;
  // No total_num_steps (or "auto", as Hugging Face writes it): the decay ends with the run.
  warnings.clear();
  c = parse_config(
      json{{"steps", 300},
           {"scheduler",
            {{"type", "WarmupDecayLR"}, {"params", {{"warmup_num_steps", 10}, {"total_num_steps", "auto"}}}}}},
      &warnings);
  ASSERT_TRUE(c) << c.error().to_string();
  EXPECT_TRUE(c->lr_decay_ends_with_run);
  EXPECT_EQ(c->lr_schedule.decay_end_step, 300);
  EXPECT_TRUE(contains(warnings, "total_num_steps not given: the decay ends with the run"));
  m = error_of({{"steps", 5}, {"scheduler", {{"type", "WarmupDecayLR"}, {"params", {{"warmup_num_steps", 10}}}}}});
  EXPECT_NE(m.find("must end (step 5) after the warmup"), std::string::npos) << m;
  m = error_of({{"schedule", {{"decay", "linear"}}}});
  EXPECT_NE(m.find("schedule.decay_end_step"), std::string::npos) << m;
  m = error_of({{"schedule", {{"warmup_steps", 10}, {"decay", "cosine"}, {"decay_end_step", 5}}}});
  EXPECT_NE(m.find("must end (step 5) after the warmup"), std::string::npos) << m;
  m = error_of({{"schedule", json::object()}, {"scheduler", {{"type", "WarmupLR"}}}});
  EXPECT_NE(m.find("keep one"), std::string::npos) << m;
}

}  // namespace
}  // namespace strata::engine
