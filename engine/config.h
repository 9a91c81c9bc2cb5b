// EngineConfig: one JSON file with the budgets, NVMe paths, batch,
// precision, optimizer and schedule (and the model's own keys, which the
// model reads: ModelKeys). The offload subset of a DeepSpeed
// config is accepted unchanged (zero_optimization.offload_optimizer /
// offload_param with device cpu|nvme and nvme_path, aio, fp16/bf16,
// optimizer, gradient_accumulation_steps, gradient_clipping,
// train_micro_batch_size_per_gpu); its offload devices become placement
// constraints for the planner. Unknown keys produce a warning naming each
// (as a dotted path); an invalid value is an InvalidArgument naming the key
// and what is allowed. Nothing is half-applied: a config either parses whole
// or not at all.
#pragma once

#include <functional>
#include <nlohmann/json_fwd.hpp>
#include <set>
#include <string>
#include <vector>

#include "cpu_optim/dtype.h"
#include "engine/config_reader.h"
#include "engine/lr_schedule.h"
#include "engine/plan.h"

namespace strata::engine {

struct OptimizerSpec {
  std::string type = "adamw";  // adam | adamw | adagrad | lion | sgd
  double lr = 1e-4;
  double beta1 = 0.9, beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
};

struct LossScaling {          // fp16 dynamic loss scaling (DeepSpeed's fields)
  int initial_scale_power = 16;  // the scale starts at 2^this
  int window = 1000;             // steps without overflow before doubling
  int hysteresis = 2;            // overflows tolerated before halving
  double min_scale = 1.0;
};

struct IoSpec {
  std::string backend = "auto";  // auto | uring | posix
  uint32_t queue_depth = 32;
  uint64_t block_bytes = 1 << 20;  // stripe unit
  std::string direct = "require";  // require | prefer | off (O_DIRECT; the latter two allow the page cache)
};

// What only a session reads ("session": the built-in GPT's trainer plans
// its own prefetch and always keeps its embeddings resident).
struct SessionSpec {
  int64_t prefetch_depth = 1;   // uses fetched ahead (depth + 1 weight slots)
  bool resident_first = false;  // the first chunk stays on the device for each step
  bool given = false;           // the config had a "session" object
};

struct EngineConfig {
  TrainSetup setup;  // the run's shape; its model is the model's to set (its keys: ModelKeys)
  Budgets budgets;
  Constraints constraints;
  std::vector<std::string> nvme_paths;
  bool nvme_budget_given = false;  // budgets.nvme was in the config (else: nvme_free_bytes of nvme_paths)
  OptimizerSpec optimizer;
  // The rate step by step (native "schedule", DeepSpeed's "scheduler");
  // optimizer.lr is its peak.
  LrSchedule lr_schedule;
  // DeepSpeed's scheduler named no total_num_steps: its decay ends at the
  // run's last step (`steps`, or what a command line makes of it).
  bool lr_decay_ends_with_run = false;
  LossScaling loss_scaling;
  double gradient_clipping = 0.0;  // global-norm clip; 0 = off
  cpu_optim::StateType adam_states = cpu_optim::StateType::kF32;  // "states": fp32 | bf16 | q8 (Adam m and v)
  bool delayed_update = false;     // opt-in one-step delayed parameter update (inexact)
  bool vertical_accumulation = false;  // batch.vertical: every micro-batch of a block at once (exact)
  SessionSpec session;
  bool speculate_in_ram = false;   // states in RAM: a second copy, so updates start as gradients land
  IoSpec io;
  uint64_t seed = 1;
  int64_t steps = 20;
  // The NUMA node of the optimizer's threads and the host memory: -1 picks
  // the one nearest the GPU (none on the host backend).
  int64_t numa_node = -1;
  // Lock the host staging arenas in RAM (mlock; cudaHostAlloc on a GPU).
  bool pin_memory = true;
};

// What the swap store can place in `dirs` now: it stripes every blob over
// all of them in equal units, so the directory with the least room per
// directory bounds them all — n x min over filesystems (free space shared
// by the directories on it). NotFound, naming it, for a directory that
// cannot be examined.
Result<uint64_t> nvme_free_bytes(const std::vector<std::string>& dirs);

// A model's own keys in a config: the object "model" and what the model
// reads of "batch" (a sequence length, say), each read with the engine's
// reader (an object absent from the config is read as empty, so its
// defaults stand and its keys are still asked about). The parser warns
// about the keys of both that neither read. With no ModelKeys, a "model"
// object is a warning: the run's model reads no config keys.
using ModelKeys = std::function<Status(ConfigReader& model, ConfigReader& batch)>;

// Parses a config (native or the DeepSpeed offload subset). Warnings about
// unknown keys are appended to `warnings`. `nvme_paths`: the NVMe
// directories when the config names none (a command line's --nvme DIR), so
// that its NVMe budget and placement keys have somewhere to go.
// `keys_asked` (optional) receives the dotted path of every key the parser
// looked for in the objects it read, present or not: docs/CONFIG.md lists
// exactly these (a test holds the two together).
// `model_keys` (optional) reads the model's keys.
// `use`: kPlan for the planner alone, on hardware this machine need not
// have: NVMe directories are only names then, when the config gives the
// NVMe budget (their free space is not read); kRun checks that each
// exists and takes O_DIRECT files.
enum class ConfigUse { kRun, kPlan };
Result<EngineConfig> parse_config(const nlohmann::json& json, std::vector<std::string>* warnings,
                                  const std::vector<std::string>& nvme_paths = {},
                                  std::set<std::string>* keys_asked = nullptr, const ModelKeys& model_keys = {},
                                  ConfigUse use = ConfigUse::kRun);
// Reads a file's JSON (comments allowed); errors name the file.
Result<nlohmann::json> read_config_file(const std::string& path);
// Reads and parses a file; errors name the file.
Result<EngineConfig> load_config(const std::string& path, std::vector<std::string>* warnings,
                                 const std::vector<std::string>& nvme_paths = {}, const ModelKeys& model_keys = {},
                                 ConfigUse use = ConfigUse::kRun);

}  // namespace strata::engine
