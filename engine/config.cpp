#include "engine/config.h"

#include <sys/statvfs.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "common/path_check.h"
#include "common/units.h"
#include "io/file.h"

namespace strata::engine {
namespace {

using nlohmann::json;
using Reader = ConfigReader;

Result<Tier> tier_from(const std::string& text) {
  if (text == "device" || text == "none") return Tier::kDevice;
  if (text == "host" || text == "cpu") return Tier::kHost;
  return Tier::kNvme;
}

Status read_optimizer(Reader& top, EngineConfig& c) {
  if (!top.has("optimizer")) return ok_status();
  STRATA_ASSIGN_OR_RETURN(Reader o, top.object("optimizer"));
  std::string type = c.optimizer.type;
  // DeepSpeed spells the type "Adam", "AdamW", ...; both spellings are accepted.
  STRATA_RETURN_IF_ERROR(o.get_choice("type", &type, {"adam", "adamw", "adagrad", "lion", "sgd", "Adam", "AdamW",
                                                      "Adagrad", "Lion", "SGD"}));
  for (char& ch : type) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  c.optimizer.type = type;
  Reader* params = &o;
  std::optional<Reader> nested;
  if (o.has("params")) {  // DeepSpeed nests the hyper-parameters
    STRATA_ASSIGN_OR_RETURN(Reader p, o.object("params"));
    nested.emplace(std::move(p));
    params = &*nested;
  }
  if (nested && type == "adam") {
    // DeepSpeed's form: its Adam is AdamW (decoupled weight decay) unless
    // params.adam_w_mode is false (ADAM_W_MODE_DEFAULT in DeepSpeed's
    // runtime/config.py); strata's own {"type": "adam"} is torch.optim.Adam.
    bool adam_w_mode = true;
    STRATA_RETURN_IF_ERROR(params->get_bool("adam_w_mode", &adam_w_mode));
    if (adam_w_mode) c.optimizer.type = "adamw";
  }
  params->ignore("torch_adam", "strata's CPU Adam runs the update either way; value ignored");
  STRATA_RETURN_IF_ERROR(params->get_double("lr", &c.optimizer.lr, 0, 10));
  STRATA_RETURN_IF_ERROR(params->get_double("eps", &c.optimizer.eps, 0, 1));
  STRATA_RETURN_IF_ERROR(params->get_double("weight_decay", &c.optimizer.weight_decay, 0, 10));
  if (params->has("betas")) {
    const json& b = params->raw("betas");
    if (!b.is_array() || b.size() != 2 || !b[0].is_number() || !b[1].is_number() || b[0].get<double>() < 0 ||
        b[0].get<double>() >= 1 || b[1].get<double>() < 0 || b[1].get<double>() >= 1) {
      return invalid_argument("config key " + params->key_path("betas") + ": expected [beta1, beta2] in [0, 1), got " +
                              b.dump());
    }
    c.optimizer.beta1 = b[0].get<double>();
    c.optimizer.beta2 = b[1].get<double>();
  }
  if (nested) nested->finish();
  o.finish();
  return ok_status();
}

// The native "schedule": {"warmup_steps", "warmup": linear | log,
// "start_lr", "decay": constant | linear | cosine, "decay_end_step" (needed
// by a decay), "end_lr"}.
Status read_native_schedule(Reader& top, EngineConfig& c) {
  STRATA_ASSIGN_OR_RETURN(Reader r, top.object("schedule"));
  LrSchedule& s = c.lr_schedule;
  STRATA_RETURN_IF_ERROR(r.get_int("warmup_steps", &s.warmup_steps, 0, int64_t{1} << 40));
  std::string warmup = "linear", decay = "constant";
  STRATA_RETURN_IF_ERROR(r.get_choice("warmup", &warmup, {"linear", "log"}));
  s.warmup = warmup == "log" ? LrSchedule::Warmup::kLog : LrSchedule::Warmup::kLinear;
  STRATA_RETURN_IF_ERROR(r.get_double("start_lr", &s.start_lr, 0, 10));
  STRATA_RETURN_IF_ERROR(r.get_choice("decay", &decay, {"constant", "linear", "cosine"}));
  s.decay = decay == "linear"   ? LrSchedule::Decay::kLinear
            : decay == "cosine" ? LrSchedule::Decay::kCosine
                                : LrSchedule::Decay::kConstant;
  STRATA_RETURN_IF_ERROR(r.get_int("decay_end_step", &s.decay_end_step, 1, int64_t{1} << 40));
  if (s.decay != LrSchedule::Decay::kConstant && s.decay_end_step == 0) {
    return invalid_argument("config key schedule.decay_end_step: a " + decay + " decay needs the step it ends at");
  }
  STRATA_RETURN_IF_ERROR(r.get_double("end_lr", &s.end_lr, 0, 10));
  r.finish();
  return validate(s).with_context("config key schedule");
}

// DeepSpeed's "scheduler": WarmupLR (warmup, then the peak warmup_max_lr),
// WarmupDecayLR (then a linear decay back to warmup_min_lr at
// total_num_steps) and WarmupCosineLR (from warmup_min_ratio of the
// optimizer's lr, a cosine decay to cos_min_ratio of it), with DeepSpeed's
// defaults (warmup_type log, 1000 warmup steps).
Status read_deepspeed_scheduler(Reader& top, EngineConfig& c) {
  STRATA_ASSIGN_OR_RETURN(Reader r, top.object("scheduler"));
  std::string type;
  STRATA_RETURN_IF_ERROR(r.get_choice("type", &type, {"WarmupLR", "WarmupDecayLR", "WarmupCosineLR"}));
  if (type.empty())
    return invalid_argument("config key scheduler.type: expected WarmupLR, WarmupDecayLR or WarmupCosineLR");
  LrSchedule& s = c.lr_schedule;
  s = LrSchedule{};
  s.warmup_steps = 1000;
  s.warmup = LrSchedule::Warmup::kLog;
  double min_lr = 0, max_lr = 0.001, warmup_min_ratio = 0, cos_min_ratio = 0.0001;
  int64_t total = 0;
  if (r.has("params")) {
    STRATA_ASSIGN_OR_RETURN(Reader p, r.object("params"));
    STRATA_RETURN_IF_ERROR(p.get_int("warmup_num_steps", &s.warmup_steps, 0, int64_t{1} << 40));
    std::string warmup = "log";
    STRATA_RETURN_IF_ERROR(p.get_choice("warmup_type", &warmup, {"log", "linear"}));
    s.warmup = warmup == "linear" ? LrSchedule::Warmup::kLinear : LrSchedule::Warmup::kLog;
    if (type == "WarmupCosineLR") {
      STRATA_RETURN_IF_ERROR(p.get_double("warmup_min_ratio", &warmup_min_ratio, 0, 1));
      STRATA_RETURN_IF_ERROR(p.get_double("cos_min_ratio", &cos_min_ratio, 0, 1));
    } else {
      STRATA_RETURN_IF_ERROR(p.get_double("warmup_min_lr", &min_lr, 0, 10));
      STRATA_RETURN_IF_ERROR(p.get_double("warmup_max_lr", &max_lr, 0, 10));
    }
    if (type != "WarmupLR") STRATA_RETURN_IF_ERROR(p.get_int("total_num_steps", &total, 1, int64_t{1} << 40));
    p.ignore("last_batch_iteration", "a resumed run takes its step from the checkpoint; value ignored");
    p.finish();
  }
  r.finish();
  if (type == "WarmupCosineLR") {
    s.start_lr = c.optimizer.lr * warmup_min_ratio;
    s.end_lr = c.optimizer.lr * cos_min_ratio;
    s.decay = LrSchedule::Decay::kCosine;
  } else {
    c.optimizer.lr = max_lr;  // DeepSpeed's peak, whatever the optimizer's lr says
    s.start_lr = s.end_lr = min_lr;
    s.decay = type == "WarmupDecayLR" ? LrSchedule::Decay::kLinear : LrSchedule::Decay::kConstant;
  }
  if (type != "WarmupLR") {
    if (total == 0) {  // absent or "auto" (Hugging Face fills in the run's steps): the run's steps
      total = c.steps;
      c.lr_decay_ends_with_run = true;
      r.warn("scheduler.params.total_num_steps not given: the decay ends with the run (step " + std::to_string(total) +
             " here)");
    }
    s.decay_end_step = total;
  }
  return validate(s).with_context("config key scheduler");
}

Status read_schedule(Reader& top, EngineConfig& c) {
  if (top.has("schedule") && top.has("scheduler")) {
    return invalid_argument("config keys schedule and scheduler (DeepSpeed's) both given; keep one");
  }
  if (top.has("schedule")) return read_native_schedule(top, c);
  if (top.has("scheduler")) return read_deepspeed_scheduler(top, c);
  return ok_status();
}

// DeepSpeed's fp16 / bf16 blocks.
Status read_precision_blocks(Reader& top, EngineConfig& c) {
  bool fp16 = false, bf16 = false;
  if (top.has("fp16")) {
    STRATA_ASSIGN_OR_RETURN(Reader f, top.object("fp16"));
    STRATA_RETURN_IF_ERROR(f.get_bool("enabled", &fp16));
    double fixed = 0;
    STRATA_RETURN_IF_ERROR(f.get_double("loss_scale", &fixed, 0, 1e30));
    if (fixed != 0) {
      return invalid_argument("config key fp16.loss_scale: only dynamic loss scaling (0) is supported, got " +
                              std::to_string(fixed));
    }
    int64_t v = c.loss_scaling.initial_scale_power;
    STRATA_RETURN_IF_ERROR(f.get_int("initial_scale_power", &v, 0, 60));
    c.loss_scaling.initial_scale_power = static_cast<int>(v);
    v = c.loss_scaling.window;
    STRATA_RETURN_IF_ERROR(f.get_int("loss_scale_window", &v, 1, 1 << 30));
    c.loss_scaling.window = static_cast<int>(v);
    v = c.loss_scaling.hysteresis;
    STRATA_RETURN_IF_ERROR(f.get_int("hysteresis", &v, 1, 1 << 20));
    c.loss_scaling.hysteresis = static_cast<int>(v);
    STRATA_RETURN_IF_ERROR(f.get_double("min_loss_scale", &c.loss_scaling.min_scale, 0, 1e30));
    f.finish();
  }
  if (top.has("bf16")) {
    STRATA_ASSIGN_OR_RETURN(Reader b, top.object("bf16"));
    STRATA_RETURN_IF_ERROR(b.get_bool("enabled", &bf16));
    b.finish();
  }
  if (fp16 && bf16) return invalid_argument("config keys fp16.enabled and bf16.enabled are both true; pick one");
  if (!fp16 && !bf16 && top.has("zero_optimization") && !top.has("precision")) {
    top.warn("neither fp16.enabled nor bf16.enabled is true: DeepSpeed would train in fp32, strata computes in " +
             std::string(dtype_name(c.setup.compute)) + " (precision: fp32 computes in fp32)");
  }
  if (fp16) c.setup.compute = DType::kF16;
  if (bf16) c.setup.compute = DType::kBF16;
  return ok_status();
}

// The optimizer stage's pieces on NVMe (DeepSpeed's sub_group_size): 0
// (whole chunks) or at least kStatePieceGranule parameters.
Status read_sub_group(Reader& r, EngineConfig& c) {
  int64_t n = c.setup.state_piece_elems;
  STRATA_RETURN_IF_ERROR(r.get_count("sub_group_size", &n, 0, int64_t{1} << 50));
  STRATA_RETURN_IF_ERROR(check_state_piece_elems(n).with_context("config key " + r.key_path("sub_group_size")));
  c.setup.state_piece_elems = n;
  return ok_status();
}

Status read_offload(Reader& zero, const std::string& key, std::optional<Tier>* tier, EngineConfig& c) {
  if (!zero.has(key)) return ok_status();
  STRATA_ASSIGN_OR_RETURN(Reader o, zero.object(key));
  std::string device;
  STRATA_RETURN_IF_ERROR(o.get_choice("device", &device, {"cpu", "nvme", "none"}));
  std::string path;
  if (o.has("nvme_path")) {
    const json& p = o.raw("nvme_path");
    if (!p.is_string() || p.get<std::string>().empty()) {
      return invalid_argument("config key " + o.key_path("nvme_path") + ": expected a directory path, got " + p.dump());
    }
    path = p.get<std::string>();
  }
  if (device == "nvme" && path.empty()) {
    return invalid_argument("config key " + o.key_path("nvme_path") + " is required when " + o.key_path("device") +
                            " is \"nvme\"");
  }
  if (!device.empty()) *tier = *tier_from(device);
  if (!path.empty() && std::find(c.nvme_paths.begin(), c.nvme_paths.end(), path) == c.nvme_paths.end()) {
    c.nvme_paths.push_back(path);
  }
  // pin_memory: false anywhere turns locking off (DeepSpeed pins per tier;
  // strata's staging arenas serve both).
  bool pin = true;
  STRATA_RETURN_IF_ERROR(o.get_bool("pin_memory", &pin));
  c.pin_memory = c.pin_memory && pin;
  const std::string chosen = "the planner sizes the buffers itself; value ignored";
  for (const char* k : {"buffer_count", "buffer_size", "max_in_cpu", "fast_init", "ratio"}) o.ignore(k, chosen);
  o.finish();
  return ok_status();
}

Status read_deepspeed(Reader& top, EngineConfig& c) {
  // DeepSpeed's batch rule on one GPU: train_batch_size = micro-batch x
  // accumulation steps; given two of the three it derives the third (only
  // train_batch_size: accumulation 1), given all three they must agree.
  const bool has_micro = top.has("train_micro_batch_size_per_gpu");
  const bool has_accum = top.has("gradient_accumulation_steps");
  STRATA_RETURN_IF_ERROR(top.get_int("train_micro_batch_size_per_gpu", &c.setup.micro_batch, 1, 1 << 20));
  STRATA_RETURN_IF_ERROR(top.get_int("gradient_accumulation_steps", &c.setup.grad_accum, 1, 1 << 20));
  if (top.has("train_batch_size")) {
    int64_t total = 0;
    STRATA_RETURN_IF_ERROR(top.get_int("train_batch_size", &total, 1, int64_t{1} << 40));
    auto refuse = [&](const std::string& why) {
      return invalid_argument("config key train_batch_size: " + std::to_string(total) + " " + why);
    };
    if (has_micro && !has_accum) {
      if (total % c.setup.micro_batch != 0) {
        return refuse("is not a multiple of train_micro_batch_size_per_gpu (" + std::to_string(c.setup.micro_batch) +
                      ")");
      }
      c.setup.grad_accum = total / c.setup.micro_batch;
    } else if (has_accum && !has_micro) {
      if (total % c.setup.grad_accum != 0) {
        return refuse("is not a multiple of gradient_accumulation_steps (" + std::to_string(c.setup.grad_accum) + ")");
      }
      c.setup.micro_batch = total / c.setup.grad_accum;
    } else if (!has_micro && !has_accum) {
      c.setup.micro_batch = total;
      c.setup.grad_accum = 1;
    } else if (total != c.setup.micro_batch * c.setup.grad_accum) {
      return refuse("!= train_micro_batch_size_per_gpu x gradient_accumulation_steps (" +
                    std::to_string(c.setup.micro_batch * c.setup.grad_accum) + ") on one GPU");
    }
  }
  STRATA_RETURN_IF_ERROR(read_precision_blocks(top, c));
  if (top.has("zero_optimization")) {
    STRATA_ASSIGN_OR_RETURN(Reader z, top.object("zero_optimization"));
    int64_t stage = 3;
    STRATA_RETURN_IF_ERROR(z.get_int("stage", &stage, 0, 3));
    STRATA_RETURN_IF_ERROR(read_offload(z, "offload_optimizer", &c.constraints.states, c));
    STRATA_RETURN_IF_ERROR(read_offload(z, "offload_param", &c.constraints.weights, c));
    STRATA_RETURN_IF_ERROR(read_sub_group(z, c));
    z.finish();
  }
  if (top.has("aio")) {
    STRATA_ASSIGN_OR_RETURN(Reader a, top.object("aio"));
    STRATA_RETURN_IF_ERROR(a.get_bytes("block_size", &c.io.block_bytes));
    int64_t qd = c.io.queue_depth;
    STRATA_RETURN_IF_ERROR(a.get_int("queue_depth", &qd, 1, 32768));
    c.io.queue_depth = static_cast<uint32_t>(qd);
    for (const char* k : {"thread_count", "single_submit", "overlap_events"}) {
      a.ignore(k, "strata uses one io_uring per issuing thread; value ignored");
    }
    a.finish();
  }
  return ok_status();
}

// "session": what only a session reads.
Status read_session(Reader& top, EngineConfig& c) {
  if (!top.has("session")) return ok_status();
  STRATA_ASSIGN_OR_RETURN(Reader s, top.object("session"));
  STRATA_RETURN_IF_ERROR(s.get_int("prefetch_depth", &c.session.prefetch_depth, 1, 1024));
  STRATA_RETURN_IF_ERROR(s.get_bool("resident_first", &c.session.resident_first));
  s.finish();
  c.session.given = true;
  return ok_status();
}

// "model" and "batch": the model's keys beside the engine's.
Status read_model_and_batch(Reader& top, EngineConfig& c, const ModelKeys& model_keys) {
  static const json kEmpty = json::object();
  Reader b(kEmpty, "batch", top.warnings(), top.asked());
  if (top.has("batch")) {
    STRATA_ASSIGN_OR_RETURN(b, top.object("batch"));
  }
  STRATA_RETURN_IF_ERROR(b.get_int("micro_batch", &c.setup.micro_batch, 1, 1 << 20));
  STRATA_RETURN_IF_ERROR(b.get_int("grad_accum", &c.setup.grad_accum, 1, 1 << 20));
  STRATA_RETURN_IF_ERROR(b.get_bool("vertical", &c.vertical_accumulation));
  if (!model_keys) {
    top.ignore("model", "this run's model reads no config keys (\"model\" is the built-in GPT's); ignored");
    b.finish();
    return ok_status();
  }
  Reader m(kEmpty, "model", top.warnings(), top.asked());
  if (top.has("model")) {
    STRATA_ASSIGN_OR_RETURN(m, top.object("model"));
  }
  STRATA_RETURN_IF_ERROR(model_keys(m, b));
  m.finish();
  b.finish();
  return ok_status();
}

Status read_native(Reader& top, EngineConfig& c, const ModelKeys& model_keys) {
  STRATA_RETURN_IF_ERROR(read_model_and_batch(top, c, model_keys));
  if (top.has("budgets")) {
    STRATA_ASSIGN_OR_RETURN(Reader b, top.object("budgets"));
    // 0 would read as "not given" downstream and be replaced by a default:
    // refused, so a budget of nothing is never silently a budget of a GiB.
    STRATA_RETURN_IF_ERROR(b.get_bytes("device", &c.budgets.device_bytes, 1));
    STRATA_RETURN_IF_ERROR(b.get_bytes("host", &c.budgets.host_bytes, 1));
    STRATA_RETURN_IF_ERROR(b.get_bytes("nvme", &c.budgets.nvme_bytes, 1));
    b.finish();
  }
  if (top.has("nvme_paths")) {
    const json& p = top.raw("nvme_paths");
    if (!p.is_array()) return invalid_argument("config key nvme_paths: expected an array of directories");
    for (const json& d : p) {
      if (!d.is_string() || d.get<std::string>().empty()) {
        return invalid_argument("config key nvme_paths: expected directory paths, got " + d.dump());
      }
      c.nvme_paths.push_back(d.get<std::string>());
    }
  }
  std::string precision;
  STRATA_RETURN_IF_ERROR(top.get_choice("precision", &precision, {"bf16", "fp16", "fp32"}));
  if (!precision.empty()) c.setup.compute = *dtype_from_name(precision);
  std::string states;
  STRATA_RETURN_IF_ERROR(top.get_choice("states", &states, {"fp32", "bf16", "q8"}));
  if (!states.empty()) c.adam_states = *cpu_optim::parse_state_type(states);
  c.setup.state_bytes_per_param = cpu_optim::adam_state_bytes_per_param(c.adam_states);
  STRATA_RETURN_IF_ERROR(top.get_bool("delayed_update", &c.delayed_update));
  STRATA_RETURN_IF_ERROR(top.get_bool("speculate_in_ram", &c.speculate_in_ram));
  STRATA_RETURN_IF_ERROR(top.get_double("gradient_clipping", &c.gradient_clipping, 0, 1e30));
  int64_t seed = static_cast<int64_t>(c.seed);
  STRATA_RETURN_IF_ERROR(top.get_int("seed", &seed, 0, std::numeric_limits<int64_t>::max()));
  c.seed = static_cast<uint64_t>(seed);
  STRATA_RETURN_IF_ERROR(top.get_int("steps", &c.steps, 0, int64_t{1} << 40));
  STRATA_RETURN_IF_ERROR(top.get_int("numa_node", &c.numa_node, -1, 4095));
  STRATA_RETURN_IF_ERROR(top.get_bool("pin_memory", &c.pin_memory));
  if (top.has("placement")) {
    STRATA_ASSIGN_OR_RETURN(Reader p, top.object("placement"));
    std::string w, s, ck, g;
    STRATA_RETURN_IF_ERROR(p.get_choice("weights", &w, {"device", "host", "nvme"}));
    STRATA_RETURN_IF_ERROR(p.get_choice("states", &s, {"host", "nvme"}));
    STRATA_RETURN_IF_ERROR(p.get_choice("activations", &ck, {"device", "host", "nvme"}));
    if (p.has("checkpoints")) {  // the key's old name: the word now means saved models only
      if (!ck.empty()) {
        return invalid_argument("config key placement: both \"activations\" and its old name \"checkpoints\"; "
                                "keep \"activations\"");
      }
      STRATA_RETURN_IF_ERROR(p.get_choice("checkpoints", &ck, {"device", "host", "nvme"}));
      p.warn("placement.checkpoints is the old name of placement.activations; read as it");
    }
    STRATA_RETURN_IF_ERROR(p.get_choice("gradients", &g, {"host", "nvme"}));
    if (!w.empty()) c.constraints.weights = *tier_from(w);
    if (!s.empty()) c.constraints.states = *tier_from(s);
    if (!ck.empty()) c.constraints.activations = *tier_from(ck);
    if (!g.empty()) c.constraints.gradients = *tier_from(g);
    int64_t ring = c.setup.gradient_buffers;
    STRATA_RETURN_IF_ERROR(p.get_int("gradient_buffers", &ring, 1, 64));
    c.setup.gradient_buffers = static_cast<int>(ring);
    STRATA_RETURN_IF_ERROR(read_sub_group(p, c));
    p.finish();
  }
  STRATA_RETURN_IF_ERROR(read_session(top, c));
  if (top.has("io")) {
    STRATA_ASSIGN_OR_RETURN(Reader io, top.object("io"));
    STRATA_RETURN_IF_ERROR(io.get_choice("backend", &c.io.backend, {"auto", "uring", "posix"}));
    int64_t qd = c.io.queue_depth;
    STRATA_RETURN_IF_ERROR(io.get_int("queue_depth", &qd, 1, 32768));
    c.io.queue_depth = static_cast<uint32_t>(qd);
    STRATA_RETURN_IF_ERROR(io.get_bytes("block_size", &c.io.block_bytes));
    STRATA_RETURN_IF_ERROR(io.get_choice("direct", &c.io.direct, {"require", "prefer", "off"}));
    io.finish();
  }
  return ok_status();
}

}  // namespace

Result<EngineConfig> parse_config(const nlohmann::json& j, std::vector<std::string>* warnings,
                                  const std::vector<std::string>& nvme_paths, std::set<std::string>* keys_asked,
                                  const ModelKeys& model_keys, ConfigUse use) {
  std::vector<std::string> local;
  if (warnings == nullptr) warnings = &local;
  if (!j.is_object()) return invalid_argument("config: expected a JSON object at the top level");
  EngineConfig c;
  Reader top(j, "", warnings, keys_asked);
  STRATA_RETURN_IF_ERROR(read_native(top, c, model_keys));
  STRATA_RETURN_IF_ERROR(read_deepspeed(top, c));
  STRATA_RETURN_IF_ERROR(read_optimizer(top, c));
  STRATA_RETURN_IF_ERROR(read_schedule(top, c));
  top.finish();
  if (c.nvme_paths.empty()) c.nvme_paths = nvme_paths;
  const bool nvme_used = c.constraints.weights == Tier::kNvme || c.constraints.states == Tier::kNvme ||
                         c.constraints.activations == Tier::kNvme || c.constraints.gradients == Tier::kNvme;
  if ((nvme_used || c.budgets.nvme_bytes > 0) && c.nvme_paths.empty()) {
    return invalid_argument(
        "config: an NVMe budget or placement needs nvme_paths (or a DeepSpeed nvme_path, or strata-train --nvme DIR)");
  }
  const io::DirectMode direct = c.io.direct == "off"      ? io::DirectMode::kOff
                                : c.io.direct == "prefer" ? io::DirectMode::kPrefer
                                                          : io::DirectMode::kRequire;
  c.nvme_budget_given = c.budgets.nvme_bytes > 0;
  const bool names_only = use == ConfigUse::kPlan && c.nvme_budget_given;
  for (const std::string& dir : c.nvme_paths) {
    if (names_only) break;
    STRATA_RETURN_IF_ERROR(io::check_directory(dir, direct).with_context("config nvme_paths"));
  }
  if (!c.nvme_budget_given && !c.nvme_paths.empty()) {
    Result<uint64_t> free = nvme_free_bytes(c.nvme_paths);
    if (!free) return std::move(free).error().with_context("config nvme_paths");
    c.budgets.nvme_bytes = *free;
    warnings->push_back("budgets.nvme not given: using the free space of nvme_paths (" + format_bytes(*free) + ")");
  }
  return c;
}

Result<uint64_t> nvme_free_bytes(const std::vector<std::string>& dirs) {
  std::map<uint64_t, std::pair<uint64_t, uint64_t>> filesystems;  // fsid -> (free bytes, directories on it)
  for (const std::string& dir : dirs) {
    struct statvfs st {};
    if (::statvfs(dir.c_str(), &st) != 0) {
      return not_found("NVMe directory " + dir + " is not accessible (" + errno_name(errno) +
                       "); create it or fix the path");
    }
    auto& [free, count] = filesystems[static_cast<uint64_t>(st.f_fsid)];
    free = static_cast<uint64_t>(st.f_bavail) * st.f_frsize;
    ++count;
  }
  uint64_t per_dir = std::numeric_limits<uint64_t>::max();
  for (const auto& [fsid, fs] : filesystems) per_dir = std::min(per_dir, fs.first / fs.second);
  return dirs.empty() ? 0 : per_dir * dirs.size();
}

Result<json> read_config_file(const std::string& path) {
  STRATA_ASSIGN_OR_RETURN(std::string text, read_input_file(path, "config file"));
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false, /*ignore_comments=*/true);
  if (j.is_discarded()) return invalid_argument("config file " + path + " is not valid JSON");
  return j;
}

Result<EngineConfig> load_config(const std::string& path, std::vector<std::string>* warnings,
                                 const std::vector<std::string>& nvme_paths, const ModelKeys& model_keys,
                                 ConfigUse use) {
  STRATA_ASSIGN_OR_RETURN(json j, read_config_file(path));
  Result<EngineConfig> c = parse_config(j, warnings, nvme_paths, nullptr, model_keys, use);
  if (!c) return std::move(c).error().with_context(path);
  return c;
}

}  // namespace strata::engine
