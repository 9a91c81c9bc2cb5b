// `strata train` (and `strata plan`, and the strata-train program): trains
// a GPT on the host backend (or a CUDA GPU with
// --device cuda) from a config (an embedded
// default when none is given) on the deterministic synthetic stream or a
// token file (--data), printing the planner's view of the run, then one
// progress line per step, and a JSON summary last. Optimizer states in RAM, or on NVMe with --nvme DIR;
// checkpoints with --checkpoint DIR (every --save-every steps and at the end),
// resumed with --resume. SIGINT or SIGTERM stops the run, with a checkpoint
// when --checkpoint is given: after the step in progress when it is due to
// end within --stop-grace seconds (by the last step's time), otherwise — the
// first step, or long ones — cancelling it before its next block, with the
// state of the step before (a second signal ends the process at once).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "bench/bench_util.h"
#include "common/unique_fd.h"
#include "common/units.h"
#include "engine/checkpoint_io.h"
#include "engine/config.h"
#include "models/gpt/token_data.h"
#include "models/gpt/trainer.h"
#include "models/gpt/trainer_config.h"
#include "tools/arithmetic_data.h"
#include "tools/train_command.h"
#include "tools/cli_errors.h"

namespace strata::tools {
namespace {

using bench::exit_on_error;
using bench::system_info;

// The signal that asked the run to stop (0: none). The handler only stores
// it and restores the default action, so a second signal ends the process.
volatile std::sig_atomic_t g_stop_signal = 0;
extern "C" void request_stop(int sig) {
  g_stop_signal = sig;
  std::signal(sig, SIG_DFL);
}

// The stop rule (TrainerOptions::stop): a step in progress when a stop
// signal comes finishes when, by the last step's time, it is due to end
// within grace_s; otherwise — the first step, or long ones — it is
// cancelled. It knows when the step in progress began, how long the last
// one took (0: none yet), and whether it cancelled one.
struct StopRule {
  double grace_s = 10;
  std::chrono::steady_clock::time_point step_start = std::chrono::steady_clock::now();
  double last_step_s = 0;
  bool cancelled = false;
  // Polled by the trainer before each block of a step.
  bool operator()() {
    if (g_stop_signal == 0) return false;
    const double spent = std::chrono::duration<double>(std::chrono::steady_clock::now() - step_start).count();
    if (last_step_s > 0 && last_step_s - spent <= grace_s) return false;
    cancelled = true;
    return true;
  }
};

// Progress lines for long work chunk by chunk (TrainerOptions::progress):
// at most one every two seconds, and the time it took at the end when that
// was a second or more.
class ProgressLines {
 public:
  void operator()(std::string_view what, int64_t done, int64_t total) {
    const auto now = std::chrono::steady_clock::now();
    if (what != what_ || done < done_) {  // a new piece of work
      what_ = std::string(what);
      start_ = last_ = now;
    }
    done_ = done;
    const double elapsed = std::chrono::duration<double>(now - start_).count();
    if (done == total) {
      if (elapsed >= 1.0)
        std::printf("%s: %lld chunks in %.1f s\n", what_.c_str(), static_cast<long long>(total), elapsed);
      what_.clear();
      done_ = 0;
    } else if (std::chrono::duration<double>(now - last_).count() >= 2.0) {
      std::printf("%s: %lld of %lld chunks (%.0f%%, %.0f s)\n", what_.c_str(), static_cast<long long>(done),
                  static_cast<long long>(total), 100.0 * static_cast<double>(done) / static_cast<double>(total),
                  elapsed);
      last_ = now;
    } else {
      return;
    }
    std::fflush(stdout);
  }

 private:
  std::string what_;
  int64_t done_ = 0;
  std::chrono::steady_clock::time_point start_, last_;
};

// The embedded default: a small GPT a 2-core machine trains in seconds.
const char* kDefaultConfig = R"({
  "model": {"layers": 4, "hidden": 128, "heads": 4, "vocab": 256, "max_seq": 64},
  "batch": {"micro_batch": 8, "seq": 64},
  "budgets": {"device": "64MiB", "host": "4GiB"},
  "precision": "bf16",
  "optimizer": {"type": "adamw", "lr": 0.003, "weight_decay": 0.01},
  "seed": 1,
  "steps": 60
})";

// The command line.
struct Flags {
  std::string prog = "strata-train";  // the program's name in messages
  std::string config_path, nvme, checkpoint, adam_states, trace_path;
  std::string data_path, data_type = "uint16";
  int arithmetic_digits = 3;
  int64_t eval_examples = 200;
  std::string activations = "device", weights_on = "host", device = "host", gradients_on;
  int64_t steps = -1, save_every = 0, sub_group = -1, keep_checkpoints = 0;
  int prefetch = 1;
  double stop_grace_s = 10;
  bool resume = false, stream = false, delayed = false, speculate_in_ram = false, plan_only = false;
  bool auto_placement = false, vertical = false, no_pin = false;
};

// The flags, in --help's order: the run, then the placement.
void add_run_flags(CLI::App& app, Flags& f) {
  app.add_option("--config", f.config_path, "JSON config (strata or DeepSpeed keys); default: an embedded small GPT");
  // -1 (unset) is the flag's default only: a negative count given is an
  // error, never the config's count.
  app.add_option("--steps", f.steps, "optimizer steps, 0 or more (default: the config's)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 40));
  app.add_option("--nvme", f.nvme, "keep the optimizer states on NVMe in this directory");
  app.add_option("--checkpoint", f.checkpoint, "checkpoint directory");
  app.add_option("--save-every", f.save_every, "also checkpoint every N steps")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 40));
  app.add_option("--keep-checkpoints", f.keep_checkpoints,
                 "after each checkpoint, remove the older ones but the newest N (and the one 'latest' names); "
                 "0, the default: keep all")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 20));
  app.add_option("--stop-grace", f.stop_grace_s,
                 "seconds a step in progress at SIGINT/SIGTERM may still take (by the last step's time) to finish; "
                 "longer, or the first step, and it is cancelled before its next block (default 10)")
      ->check(CLI::Range(0.0, 1e9));
  app.add_flag("--delayed-update", f.delayed,
               "run each optimizer update beside the next step's compute (NOT exact: one step stale)");
  app.add_flag("--speculate-in-ram", f.speculate_in_ram,
               "with the optimizer states in RAM, keep a second copy of them (12 bytes per parameter) so that "
               "each chunk is updated as its gradient lands (exact, rolled back when the step clips or skips)");
  app.add_flag("--vertical-accumulation", f.vertical,
               "with gradient accumulation, run every micro-batch of a block while its weights are on the device "
               "(the weights move once per step, not once per micro-batch; the same numbers; every micro-batch's "
               "saved activations are kept at once, on the tier --activations-on names; config "
               "batch.vertical)");
  app.add_flag("--resume", f.resume,
               "continue from the latest checkpoint in --checkpoint (its weights and states replace the "
               "initialisation, which is skipped)");
  app.add_flag("--plan-only", f.plan_only,
               "print the planner's estimate for this config and these flags (bytes per tier, time per link, "
               "the placement) and exit: 0 if it fits the budgets, 1 if not");
  app.add_flag("--auto-placement", f.auto_placement,
               "run the planner's placement: the fastest that fits the config's budgets (weights resident or "
               "streamed from RAM or NVMe, the states in RAM — with a second copy if it pays — or on NVMe, the "
               "saved activations, the prefetch depth); NVMe is a tier only with --nvme DIR or the config's NVMe paths. "
               "Not with --stream-weights, --weights-on, --activations-on, --prefetch or --speculate-in-ram");
}

void add_placement_flags(CLI::App& app, Flags& f) {
  app.add_flag("--stream-weights", f.stream,
               "keep only a window of blocks on the device, capped at the config's device budget");
  app.add_option("--activations-on", f.activations, "where block inputs wait for backward when streaming")
      ->check(CLI::IsMember({"device", "host", "nvme"}));
  app.add_option("--weights-on", f.weights_on,
                 "where the working weights live between uses when streaming (nvme needs --nvme)")
      ->check(CLI::IsMember({"host", "nvme"}));
  app.add_option("--gradients-on", f.gradients_on,
                 "where the gradients wait for the optimizer: host (a buffer per chunk), or nvme (a ring of "
                 "chunk buffers, three unless the config's placement.gradient_buffers says; each gradient written "
                 "to NVMe as it lands, read back only for an update after the verdict; needs --nvme, no "
                 "--delayed-update, and with grad_accum > 1 --vertical-accumulation in one pass; the same "
                 "numbers); default: the config's placement.gradients, else host")
      ->check(CLI::IsMember({"host", "nvme"}));
  app.add_option("--trace", f.trace_path,
                 "write a Chrome-trace JSON (opens in Perfetto) of every step's phases, optimizer calls and NVMe "
                 "requests");
  app.add_option("--data", f.data_path,
                 "train on this token file (a flat array of little-endian tokens, as nanoGPT's train.bin) instead "
                 "of the synthetic stream; read in order and wrapped, so --resume goes on where the run stopped. "
                 "\"arithmetic\": the built-in corpus of additions (\"123+456=0579\\n\" as bytes), with the "
                 "held-out exact-match accuracy printed at the end (a file of that name: ./arithmetic)");
  app.add_option("--arithmetic-digits", f.arithmetic_digits, "digits of each operand of --data arithmetic (default 3)")
      ->check(CLI::Range(1, 6));
  app.add_option("--eval-examples", f.eval_examples,
                 "held-out examples --data arithmetic is scored on at the end (default 200; 0: none)")
      ->check(CLI::Range(int64_t{0}, int64_t{100000}));
  app.add_option("--data-type", f.data_type,
                 "the token file's integers: uint16 (default), uint32, or uint8 (raw bytes: a byte-level model of any "
                 "file, for a vocabulary of 256)")
      ->check(CLI::IsMember({"uint8", "uint16", "uint32"}));
  app.add_flag("--no-pin-memory", f.no_pin, "do not lock the host staging buffers in RAM (config pin_memory: false)");
  app.add_option("--adam-states", f.adam_states,
                 "how Adam's m and v are stored: fp32, bf16 or q8 (8-bit blockwise); default: the config's "
                 "\"states\" (fp32)")
      ->check(CLI::IsMember({"fp32", "bf16", "q8"}));
  app.add_option("--sub-group-size", f.sub_group,
                 "with the states on NVMe, read, update and write a chunk in pieces of at most this many parameters "
                 "(0: whole chunks; default: the config's sub_group_size, else 2^25)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 50));
  app.add_option("--prefetch", f.prefetch, "blocks fetched ahead when streaming (default 1)")->check(CLI::Range(1, 64));
  app.add_option("--device", f.device,
                 "where forward and backward run: the host backend, or the first CUDA GPU (a CUDA build)")
      ->check(CLI::IsMember({"host", "cuda"}));
}

// --gradients-on's tier (the flag given).
engine::Tier gradients_flag(const Flags& f) {
  return f.gradients_on == "nvme" ? engine::Tier::kNvme : engine::Tier::kHost;
}

// What a run is: the trainer's options, the budgets it is held to, the
// planner's reason when it chose the placement, and the steps to reach.
struct Run {
  engine::TrainerOptions o;
  engine::Budgets budgets;
  std::string auto_why;
  int64_t steps = 0;
};

// The config's options with the flags' changes that are not placement.
void apply_flags(const Flags& f, engine::EngineConfig& cfg, Run& r) {
  engine::TrainerOptions& o = r.o;
  o.vertical_accumulation = o.vertical_accumulation || f.vertical;
  if (o.vertical_accumulation && o.grad_accum > 1) {
    std::printf("vertical accumulation: the %lld micro-batches of each block run while its weights are on the device\n",
                static_cast<long long>(o.grad_accum));
  }
  o.delayed_update = f.delayed || cfg.delayed_update;
  if (o.delayed_update) std::printf("delayed parameter update: each step computes with weights one update stale\n");
  if (!f.nvme.empty()) {
    o.states = engine::Tier::kNvme;
    o.nvme_paths = {f.nvme};
    if (!cfg.nvme_budget_given) {  // the budget is --nvme's free space, not the config's directories'
      Result<uint64_t> free = engine::nvme_free_bytes(o.nvme_paths);
      exit_on_error(free.status().with_context("--nvme"), f.prog);
      cfg.budgets.nvme_bytes = *free;
    }
  }
  if (f.sub_group >= 0) {
    o.state_piece_elems = f.sub_group;
    exit_on_error(engine::check_state_piece_elems(o.state_piece_elems).with_context("--sub-group-size"),
                  f.prog);
  }
  o.speculate_in_ram = (f.speculate_in_ram || cfg.speculate_in_ram) && o.states == engine::Tier::kHost;
  if ((f.speculate_in_ram || cfg.speculate_in_ram) && !o.speculate_in_ram) {
    std::printf("speculate_in_ram: the states are on NVMe, where speculation keeps its second copy already\n");
  }
  // A config without budgets (a DeepSpeed one, say) gets the host backend's
  // defaults: a 1 GiB device and half the machine's memory.
  bool defaulted = false;
  r.budgets = engine::budgets_or_defaults(cfg.budgets, &defaulted);
  if (defaulted) {
    std::printf("budgets not all given in the config; using device %s, host %s\n",
                format_bytes(r.budgets.device_bytes).c_str(), format_bytes(r.budgets.host_bytes).c_str());
  }
  o.backend = f.device == "cuda" ? engine::TrainerOptions::Backend::kCuda : engine::TrainerOptions::Backend::kHost;
  if (!f.adam_states.empty()) o.adam_states = *cpu_optim::parse_state_type(f.adam_states);
  o.pin_memory = cfg.pin_memory && !f.no_pin;
}

// --auto-placement: the planner over every tier the run has, within the
// config's own constraints; what it picks is what runs, written back into
// the placement flags. An exit status when it cannot.
std::optional<int> auto_place(Flags& f, const engine::EngineConfig& cfg, Run& r) {
  if (f.stream || f.speculate_in_ram || f.weights_on != "host" || f.activations != "device" || f.prefetch != 1) {
    std::fprintf(stderr,
                 "%s: --auto-placement chooses the placement itself; drop --stream-weights, "
                 "--weights-on, --activations-on, --prefetch and --speculate-in-ram\n",
                 f.prog.c_str());
    return 2;
  }
  std::vector<std::string> paths = f.nvme.empty() ? cfg.nvme_paths : std::vector<std::string>{f.nvme};
  engine::Constraints fixed = cfg.constraints;
  if (!f.nvme.empty()) fixed.states = std::nullopt;  // --nvme makes NVMe available, the planner decides
  if (!f.gradients_on.empty()) fixed.gradients = gradients_flag(f);
  Result<engine::Plan> chosen = engine::apply_planned_placement(&r.o, r.budgets, fixed, paths);
  if (!chosen && paths.empty()) {
    std::fprintf(stderr, "%s: --auto-placement: %s (no NVMe tier: --nvme DIR gives the planner one)\n",
                 f.prog.c_str(), chosen.error().to_string().c_str());
    return 1;
  }
  exit_on_error(chosen.status().with_context("--auto-placement"), f.prog);
  f.stream = r.o.stream_weights;
  f.weights_on = r.o.weights == engine::Tier::kNvme ? "nvme" : "host";
  f.activations = std::string(engine::tier_name(r.o.activations));
  f.prefetch = r.o.prefetch_depth;
  r.auto_why = chosen->why;
  std::printf("auto placement: %s\n", r.auto_why.c_str());
  return std::nullopt;
}

// The placement: the planner's (--auto-placement), or the flags' over the
// config's placement keys (DeepSpeed's offload_param among them: weights
// kept off the device stream). An exit status when the flags cannot run.
std::optional<int> place(const CLI::App& app, Flags& f, const engine::EngineConfig& cfg, Run& r) {
  engine::TrainerOptions& o = r.o;
  if (f.auto_placement) {
    if (std::optional<int> rc = auto_place(f, cfg, r)) return rc;
  } else {
    const engine::Constraints& want = cfg.constraints;
    if (want.weights && *want.weights != engine::Tier::kDevice) {
      f.stream = true;
      if (app.count("--weights-on") == 0) f.weights_on = std::string(engine::tier_name(*want.weights));
    }
    if (want.activations && app.count("--activations-on") == 0) {
      f.activations = std::string(engine::tier_name(*want.activations));
    }
  }
  o.stream_weights = f.stream;
  o.prefetch_depth = f.prefetch;
  o.activations = f.activations == "host"   ? engine::Tier::kHost
                  : f.activations == "nvme" ? engine::Tier::kNvme
                                            : engine::Tier::kDevice;
  if (f.weights_on == "nvme" || cfg.constraints.weights == engine::Tier::kNvme) {
    if (!f.stream) {
      std::fprintf(stderr, "%s: weights on NVMe need --stream-weights\n", f.prog.c_str());
      return 2;
    }
    o.weights = engine::Tier::kNvme;
  }
  if (!f.auto_placement && !f.gradients_on.empty()) o.gradients = gradients_flag(f);
  // The engine's placement rules, in their words, and the flags that move each view.
  if (Status rule = engine::check_placement(engine::training_setup(o), engine::run_placement(o)); !rule.ok()) {
    std::fprintf(stderr,
                 "%s: %s (--stream-weights, --weights-on, --activations-on and --gradients-on move the views; "
                 "--nvme DIR puts the optimizer states on NVMe)\n",
                 f.prog.c_str(), std::string(rule.message()).c_str());
    return 2;
  }
  if (o.activations == engine::Tier::kNvme && o.nvme_paths.empty()) {
    std::fprintf(stderr, "%s: --activations-on nvme needs --nvme DIR\n", f.prog.c_str());
    return 2;
  }
  engine::apply_budgets(&o, r.budgets);  // held at run time: device, host, NVMe
  return std::nullopt;
}

// The planner's view of the run: the estimate of the placement it uses,
// and, when the planner would pick another, that one too. Whether it fits.
bool print_plan(const Flags& f, const Run& r) {
  const engine::TrainerOptions& o = r.o;
  engine::TrainSetup setup = engine::training_setup(o);
  const engine::Placement run_placement = engine::run_placement(o);
  engine::Plan plan = engine::estimate(setup, run_placement, engine::Bandwidths{});
  plan.why = !r.auto_why.empty() ? r.auto_why + " (the placement this run uses: --auto-placement)"
                                 : engine::placement_text(run_placement) +
                                       (f.stream ? ", prefetch depth " + std::to_string(f.prefetch) : std::string()) +
                                       ": the placement this run uses (its flags and config)";
  std::printf("Adam states: %s m and v (%.2f bytes per parameter, with the fp32 master weights %.2f)\n",
              std::string(cpu_optim::state_type_name(o.adam_states)).c_str(), setup.state_bytes_per_param,
              4.0 + setup.state_bytes_per_param);
  std::printf("%s", engine::format_plan(plan, r.budgets).c_str());
  const bool fits = engine::fits(plan, r.budgets);
  if (r.auto_why.empty()) {
    engine::Constraints fixed;
    fixed.states = o.states;
    Result<engine::Plan> best = engine::make_plan(setup, r.budgets, engine::Bandwidths{}, fixed);
    if (!best) {
      std::printf("planner: %s\n", best.error().to_string().c_str());
    } else if (best->placement != run_placement && (!fits || best->step_seconds < plan.step_seconds * (1 - 1e-9))) {
      std::printf("planner: %s, predicted %.4f s a step against this placement's %.4f s%s (--auto-placement runs it)\n",
                  best->why.c_str(), best->step_seconds, plan.step_seconds, fits ? "" : ", which does not fit");
    }
  }
  return fits;
}

// Where the steps' tokens come from: a token file, the built-in
// arithmetic corpus, or (neither) the trainer's synthetic stream.
struct Data {
  std::optional<engine::TokenFile> file;
  std::optional<ArithmeticData> arithmetic;
  bool any() const { return file.has_value() || arithmetic.has_value(); }
  Status micro_batch(int64_t index, const engine::TrainerOptions& o, std::span<int32_t> tokens,
                     std::span<int32_t> targets) const {
    if (file) return file->micro_batch(index, o.batch, o.model.vocab, tokens, targets);
    arithmetic->micro_batch(index, o.batch, o.seq, tokens, targets);
    return ok_status();
  }
};

// Outputs written after the run: a wrong path fails now, not after it; the
// token file is opened before the model is built.
Data check_inputs_and_outputs(const Flags& f, const engine::TrainerOptions& o) {
  if (!f.checkpoint.empty()) exit_on_error(engine::CheckpointDir(f.checkpoint).check_writable(), f.prog);
  if (!f.trace_path.empty()) {
    exit_on_error(
        check_directory_writable(std::filesystem::path(f.trace_path).parent_path().string()).with_context("--trace"),
        f.prog);
  }
  Data d;
  if (f.data_path.empty()) return d;
  if (f.data_path == "arithmetic") {
    Result<ArithmeticData> a = ArithmeticData::create(f.arithmetic_digits, o.seed, o.model.vocab);
    exit_on_error(a.status().with_context("--data arithmetic"), f.prog);
    d.arithmetic.emplace(*a);
    std::printf("data: the built-in arithmetic corpus, %d-digit additions (%lld bytes each, e.g. %s), 1 pair in %d "
                "held out\n",
                f.arithmetic_digits, static_cast<long long>(a->example_bytes()),
                a->train_example(0).substr(0, static_cast<size_t>(a->example_bytes() - 1)).c_str(),
                ArithmeticData::kHeldOutBuckets);
    return d;
  }
  Result<engine::TokenFile> data = engine::TokenFile::open(f.data_path, *engine::parse_token_width(f.data_type), o.seq);
  exit_on_error(data.status().with_context("--data"), f.prog);
  std::printf("data: %s, %lld tokens (%s)\n", f.data_path.c_str(), static_cast<long long>(data->tokens()),
              f.data_type.c_str());
  d.file.emplace(std::move(data).value());
  return d;
}

// A checkpoint of the trainer's step, then the older ones pruned to
// --keep-checkpoints.
void save_checkpoint(engine::Trainer& tr, engine::CheckpointDir& checkpoints, const Flags& f) {
  exit_on_error(tr.save(checkpoints), f.prog);
  Result<int> pruned = checkpoints.prune(static_cast<int>(f.keep_checkpoints));
  exit_on_error(pruned.status().with_context("--keep-checkpoints"), f.prog);
}

// What the steps did, for the summary.
struct Totals {
  int64_t steps = 0;
  float first = 0, last = 0;
  double seconds = 0, idle_sum = 0;
  uint64_t nvme_bytes = 0, ssd_written = 0;
  double held_out_accuracy = -1;  // --data arithmetic: measured at the end
};

// "45s", "3m20s", "2h05m".
std::string format_duration(double seconds) {
  const int64_t s = static_cast<int64_t>(std::llround(seconds));
  char buf[32];
  if (s < 60) {
    std::snprintf(buf, sizeof buf, "%llds", static_cast<long long>(s));
  } else if (s < 3600) {
    std::snprintf(buf, sizeof buf, "%lldm%02llds", static_cast<long long>(s / 60), static_cast<long long>(s % 60));
  } else {
    std::snprintf(buf, sizeof buf, "%lldh%02lldm", static_cast<long long>(s / 3600),
                  static_cast<long long>(s / 60 % 60));
  }
  return buf;
}

// Step i's line (i from 0; `remaining` steps after it, for the time left at
// the mean step time so far), and its share of the totals.
void print_step(const engine::Trainer& tr, const engine::TrainerOptions& o, int64_t i, int64_t remaining, float loss,
                double s, Totals& t) {
  const double tokens = static_cast<double>(o.batch * o.seq * o.grad_accum);
  const double flops = gpt::training_flops_per_token(o.model, o.seq, /*recompute=*/false) * tokens;
  const engine::StageCounters& st = tr.last_stage();
  const engine::StepCounters& k = tr.last_counters();
  t.seconds += s;
  ++t.steps;
  t.last = loss;
  t.nvme_bytes += k.nvme_read_bytes + k.nvme_written_bytes;
  t.ssd_written += k.nvme_written_bytes;
  t.idle_sum += k.device_idle_fraction;
  std::string scale;
  if (o.precision == DType::kF16) scale = " | loss scale 2^" + std::to_string(std::ilogb(tr.loss_scale()));
  std::printf(
      "step %5lld | loss %.4f | lr %.3g | grad norm %8.3f%s%s | %8.0f tok/s | %6.2f GFLOP/s | "
      "optimizer %6.1f ms | device idle %4.1f%% | h2d/d2h %s/%s | nvme r/w %s/%s%s\n",
      static_cast<long long>(i + 1), loss, tr.last_lr(), tr.last_grad_norm(),
      tr.last_skipped()   ? " (inf/nan: skipped)"
      : tr.last_clipped() ? " (clipped)"
                          : "",
      scale.c_str(), tokens / s, flops / s / 1e9, st.seconds * 1e3, 100 * k.device_idle_fraction,
      format_bytes(k.h2d_bytes).c_str(), format_bytes(k.d2h_bytes).c_str(), format_bytes(k.nvme_read_bytes).c_str(),
      format_bytes(k.nvme_written_bytes).c_str(),
      remaining > 0
          ? (" | eta " + format_duration(t.seconds / static_cast<double>(t.steps) * static_cast<double>(remaining)))
                .c_str()
          : "");
  std::fflush(stdout);
}

// The steps from the trainer's step count to `steps` (until a stop
// signal), on the token file's micro-batches or the synthetic stream,
// checkpointing every save_every into `checkpoints` (null: no
// --checkpoint); the step of the last checkpoint written.
int64_t run_steps(engine::Trainer& tr, engine::CheckpointDir* checkpoints, const Flags& f, const Run& r,
                  const Data& data, Totals& t, StopRule& stop) {
  const engine::TrainerOptions& o = r.o;
  // Step i's micro-batches: grad_accum x batch x seq, micro-batch index
  // i x grad_accum + k (the checkpoint's data position).
  std::vector<int32_t> tokens(static_cast<size_t>(o.grad_accum * o.batch * o.seq)), targets(tokens.size());
  auto step_on = [&](const Data& d, int64_t i) -> Result<float> {
    const size_t mb = static_cast<size_t>(o.batch * o.seq);
    for (int64_t k = 0; k < o.grad_accum; ++k) {
      const size_t at = static_cast<size_t>(k) * mb;
      STRATA_RETURN_IF_ERROR(d.micro_batch(i * o.grad_accum + k, o, std::span(tokens).subspan(at, mb),
                                           std::span(targets).subspan(at, mb)));
    }
    return tr.step(tokens, targets);
  };
  const int64_t start = tr.steps_done();
  int64_t saved_at = f.resume ? start : -1;
  std::signal(SIGINT, request_stop);
  std::signal(SIGTERM, request_stop);
  for (int64_t i = start; i < r.steps && g_stop_signal == 0; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    stop.step_start = t0;
    Result<float> loss = data.any() ? step_on(data, i) : tr.step();
    if (!loss && loss.error().code() == StatusCode::kCancelled && stop.cancelled) break;  // the signal's
    exit_on_error(loss.status(), f.prog);
    stop.last_step_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (i == start) t.first = *loss;
    print_step(tr, o, i, r.steps - i - 1, *loss,
               std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), t);
    if (checkpoints != nullptr && f.save_every > 0 && (i + 1) % f.save_every == 0) {
      save_checkpoint(tr, *checkpoints, f);
      saved_at = i + 1;
    }
  }
  return saved_at;
}

// The summary's JSON object, the last line.
void print_summary(const engine::Trainer& tr, const Flags& f, const Run& r, int64_t ran, const Totals& t) {
  const engine::TrainerOptions& o = r.o;
  const double tokens = static_cast<double>(o.batch * o.seq * o.grad_accum);
  nlohmann::json j = {{"bench", "train"},
                      {"steps", ran},
                      {"first_loss", t.first},
                      {"last_loss", t.last},
                      {"tokens_per_s", ran > 0 ? tokens * static_cast<double>(ran) / t.seconds : 0.0},
                      {"parameters", gpt::parameter_count(o.model)},
                      {"states", std::string(engine::tier_name(o.states))},
                      {"gradients", std::string(engine::tier_name(o.gradients))},
                      {"adam_states", std::string(cpu_optim::state_type_name(o.adam_states))},
                      {"weights", std::string(engine::tier_name(o.weights))},
                      {"nvme_bytes", t.nvme_bytes},
                      {"ssd_bytes_written", t.ssd_written},
                      {"device_idle_fraction", ran > 0 ? t.idle_sum / static_cast<double>(ran) : 0.0},
                      {"stream_weights", f.stream},
                      {"device", f.device},
                      {"system", system_info()}};
  if (tr.device() != nullptr) j["device_peak_bytes"] = tr.device()->peak_bytes();
  if (t.held_out_accuracy >= 0) j["held_out_accuracy"] = t.held_out_accuracy;
  std::printf("%s\n", j.dump().c_str());
}

// Builds the trainer (resumed when asked), runs the steps, writes the last
// checkpoint and the trace, prints the summary. The exit status.
int train(const Flags& f, Run& r) {
  Data data = check_inputs_and_outputs(f, r.o);
  // The checkpoint root's writer lock, held for the whole run: a second run
  // on the same --checkpoint is refused before it builds anything.
  std::optional<engine::CheckpointDir> checkpoints;
  if (!f.checkpoint.empty()) {
    checkpoints.emplace(f.checkpoint);
    exit_on_error(checkpoints->lock(), f.prog);
  }
  engine::Trace trace(!f.trace_path.empty());
  if (trace.enabled()) r.o.trace = &trace;
  ProgressLines progress;
  r.o.progress = std::ref(progress);
  r.o.initial_state = !f.resume;  // a resume's weights and states come from the checkpoint
  StopRule stop;
  stop.grace_s = f.stop_grace_s;
  r.o.stop = std::ref(stop);
  Result<std::unique_ptr<engine::Trainer>> created = engine::Trainer::create(r.o);
  exit_on_error(created.status(), f.prog);
  engine::Trainer& tr = **created;
  if (f.resume) {
    exit_on_error(tr.load(f.checkpoint), f.prog);
    std::printf("resumed from %s at step %lld\n", f.checkpoint.c_str(), static_cast<long long>(tr.steps_done()));
    if (tr.steps_done() >= r.steps) {
      std::printf("nothing to run: the checkpoint is at step %lld, --steps asks for %lld\n",
                  static_cast<long long>(tr.steps_done()), static_cast<long long>(r.steps));
    }
  }
  const int64_t start = tr.steps_done();
  Totals totals;
  const int64_t saved_at = run_steps(tr, checkpoints ? &*checkpoints : nullptr, f, r, data, totals, stop);
  const int stop_signal = g_stop_signal;
  if (stop_signal != 0) {
    const std::string cancelled = stop.cancelled ? ", step " + std::to_string(tr.steps_done() + 1) +
                                                       " in progress cancelled (not due to end within --stop-grace)"
                                                 : "";
    std::printf("stopping after step %lld: %s%s%s\n", static_cast<long long>(tr.steps_done()),
                stop_signal == SIGINT ? "SIGINT" : "SIGTERM", cancelled.c_str(),
                f.checkpoint.empty() ? " (no --checkpoint: nothing saved)" : ", saving a checkpoint");
    std::fflush(stdout);
  }
  if (checkpoints) {
    // The last step's checkpoint, unless it was just written (or loaded).
    if (saved_at != tr.steps_done()) save_checkpoint(tr, *checkpoints, f);
    std::printf("checkpoint: %s\n", checkpoints->latest()->path.c_str());
  }
  if (trace.enabled()) {
    exit_on_error(trace.write(f.trace_path), f.prog);
    std::printf("trace: %s (%zu events)\n", f.trace_path.c_str(), trace.size());
  }
  if (data.arithmetic && f.eval_examples > 0) {
    Result<double> acc = held_out_accuracy(tr, r.o.model, *data.arithmetic, f.eval_examples);
    exit_on_error(acc.status(), f.prog);
    totals.held_out_accuracy = *acc;
    std::printf("held-out exact match: %.1f%% of %lld additions never trained on (chance: 1 in 10^%d)\n",
                100.0 * *acc, static_cast<long long>(f.eval_examples), f.arithmetic_digits + 1);
  }
  print_summary(tr, f, r, tr.steps_done() - start, totals);
  return stop_signal != 0 ? 128 + stop_signal : 0;  // as a shell reports a process the signal ended
}

}  // namespace

int train_main(int argc, char** argv, const std::string& prog, bool plan_only) {
  CLI::App app{prog + ": train a GPT (synthetic data, or a token file with --data) on the host backend or a CUDA "
               "GPU, with optimizer states in RAM or on NVMe"};
  app.name(prog);
  Flags f;
  f.prog = prog;
  add_run_flags(app, f);
  add_placement_flags(app, f);
  one_line_errors(app, prog);
  CLI11_PARSE(app, argc, argv);
  f.plan_only = f.plan_only || plan_only;
  if (f.resume && f.checkpoint.empty()) {
    std::fprintf(stderr, "%s: --resume needs --checkpoint DIR\n", f.prog.c_str());
    return 2;
  }
  std::vector<std::string> warnings;
  // --nvme DIR serves a config that names no NVMe directory of its own.
  const std::vector<std::string> nvme_dirs = f.nvme.empty() ? std::vector<std::string>{} : std::vector{f.nvme};
  // The planner alone plans for a drive this machine need not have.
  const engine::ConfigUse use = f.plan_only ? engine::ConfigUse::kPlan : engine::ConfigUse::kRun;
  Result<engine::GptRunConfig> run =
      f.config_path.empty()
          ? engine::parse_gpt_config(nlohmann::json::parse(kDefaultConfig), &warnings, nvme_dirs, nullptr, use)
          : engine::load_gpt_config(f.config_path, &warnings, nvme_dirs, use);
  exit_on_error(run.status(), f.prog);
  for (const std::string& w : warnings) std::fprintf(stderr, "%s: warning: %s\n", f.prog.c_str(), w.c_str());
  engine::EngineConfig* cfg = &run->engine;
  Run r;
  r.steps = f.steps < 0 ? cfg->steps : f.steps;
  Result<engine::TrainerOptions> from_config = engine::trainer_options(*run);
  exit_on_error(from_config.status(), f.prog);
  r.o = std::move(from_config).value();
  if (cfg->lr_decay_ends_with_run) {
    r.o.lr_schedule.decay_end_step = r.steps;
    exit_on_error(engine::validate(r.o.lr_schedule).with_context("scheduler (its decay ends at --steps)"),
                  f.prog);
  }
  apply_flags(f, *cfg, r);
  if (std::optional<int> rc = place(app, f, *cfg, r)) return *rc;
  const bool fits = print_plan(f, r);
  if (f.plan_only) {
    std::printf("plan only: %s\n", fits ? "fits the budgets" : "does not fit the budgets");
    return fits ? 0 : 1;
  }
  if (!fits) {
    std::fprintf(stderr,
                 "%s: the placement does not fit the budgets (see the plan above); raise a budget, change the "
                 "placement, or pass --auto-placement\n",
                 f.prog.c_str());
    return 1;
  }
  return train(f, r);
}

}  // namespace strata::tools
