// strata-train: trains a GPT on the host backend from a config (an embedded
// default when none is given) on the deterministic synthetic stream, printing
// the planner's view of the run, then one progress line per step, and a JSON
// summary last. Optimizer states in RAM, or on NVMe with --nvme DIR;
// checkpoints with --checkpoint DIR (every --save-every steps and at the end),
// resumed with --resume. SIGINT or SIGTERM stops the run after the step in
// progress, with a checkpoint when --checkpoint is given (a second signal
// ends it at once).
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
#include "engine/token_data.h"
#include "engine/trainer.h"
#include "engine/trainer_config.h"

namespace strata::bench {
namespace {

// The signal that asked the run to stop (0: none). The handler only stores
// it and restores the default action, so a second signal ends the process.
volatile std::sig_atomic_t g_stop_signal = 0;
extern "C" void request_stop(int sig) {
  g_stop_signal = sig;
  std::signal(sig, SIG_DFL);
}

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

int run(int argc, char** argv) {
  CLI::App app{"strata-train: train a GPT (synthetic data) on the host backend or a CUDA GPU, with optimizer states in RAM or on NVMe"};
  std::string adam_states;
  std::string config_path, nvme, checkpoint;
  int64_t steps = -1, save_every = 0;
  bool resume = false, stream = false, delayed = false, speculate_in_ram = false, plan_only = false;
  bool auto_placement = false;
  std::string auto_why;
  int prefetch = 1;
  std::string activations = "device", weights_on = "host", trace_path, device = "host";
  app.add_option("--config", config_path, "JSON config (strata or DeepSpeed keys); default: an embedded small GPT");
  app.add_option("--steps", steps, "optimizer steps (default: the config's)");
  app.add_option("--nvme", nvme, "keep the optimizer states on NVMe in this directory");
  app.add_option("--checkpoint", checkpoint, "checkpoint directory");
  app.add_option("--save-every", save_every, "also checkpoint every N steps")->check(CLI::Range(int64_t{0}, int64_t{1} << 40));
  app.add_flag("--delayed-update", delayed,
               "run each optimizer update beside the next step's compute (NOT exact: one step stale)");
  app.add_flag("--speculate-in-ram", speculate_in_ram,
               "with the optimizer states in RAM, keep a second copy of them (12 bytes per parameter) so that "
               "each chunk is updated as its gradient lands (exact, rolled back when the step clips or skips)");
  bool vertical = false;
  app.add_flag("--vertical-accumulation", vertical,
               "with gradient accumulation, run every micro-batch of a block while its weights are on the device "
               "(the weights move once per step, not once per micro-batch; the same numbers; activation "
               "checkpoints on the device; config batch.vertical)");
  app.add_flag("--resume", resume, "continue from the latest checkpoint in --checkpoint");
  app.add_flag("--plan-only", plan_only,
               "print the planner's estimate for this config and these flags (bytes per tier, time per link, "
               "the placement) and exit: 0 if it fits the budgets, 1 if not");
  app.add_flag("--auto-placement", auto_placement,
               "run the planner's placement: the fastest that fits the config's budgets (weights resident or "
               "streamed from RAM or NVMe, the states in RAM — with a second copy if it pays — or on NVMe, the "
               "checkpoints, the prefetch depth); NVMe is a tier only with --nvme DIR or the config's NVMe paths. "
               "Not with --stream-weights, --weights-on, --activations-on, --prefetch or --speculate-in-ram");
  app.add_flag("--stream-weights", stream,
               "keep only a window of blocks on the device, capped at the config's device budget");
  app.add_option("--activations-on", activations, "where block inputs wait for backward when streaming")
      ->check(CLI::IsMember({"device", "host", "nvme"}));
  app.add_option("--weights-on", weights_on, "where the working weights live between uses when streaming "
                 "(nvme needs --nvme)")
      ->check(CLI::IsMember({"host", "nvme"}));
  app.add_option("--trace", trace_path, "write a Chrome-trace JSON (opens in Perfetto) of every step's phases, "
                 "optimizer calls and NVMe requests");
  std::string data_path, data_type = "uint16";
  app.add_option("--data", data_path,
                 "train on this token file (a flat array of little-endian tokens, as nanoGPT's train.bin) instead "
                 "of the synthetic stream; read in order and wrapped, so --resume goes on where the run stopped");
  app.add_option("--data-type", data_type,
                 "the token file's integers: uint16 (default), uint32, or uint8 (raw bytes: a byte-level model of any "
                 "file, for a vocabulary of 256)")
      ->check(CLI::IsMember({"uint8", "uint16", "uint32"}));
  bool no_pin = false;
  app.add_flag("--no-pin-memory", no_pin, "do not lock the host staging buffers in RAM (config pin_memory: false)");
  app.add_option("--adam-states", adam_states, "how Adam's m and v are stored: fp32, bf16 or q8 (8-bit blockwise); "
                 "default: the config's \"states\" (fp32)")
      ->check(CLI::IsMember({"fp32", "bf16", "q8"}));
  int64_t sub_group = -1;
  app.add_option("--sub-group-size", sub_group,
                 "with the states on NVMe, read, update and write a chunk in pieces of at most this many parameters "
                 "(0: whole chunks; default: the config's sub_group_size, else 2^25)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 50));
  app.add_option("--prefetch", prefetch, "blocks fetched ahead when streaming (default 1)")->check(CLI::Range(1, 64));
  app.add_option("--device", device, "where forward and backward run: the host backend, or the first CUDA GPU "
                 "(a CUDA build)")
      ->check(CLI::IsMember({"host", "cuda"}));
  CLI11_PARSE(app, argc, argv);
  if (resume && checkpoint.empty()) {
    std::fprintf(stderr, "strata-train: --resume needs --checkpoint DIR\n");
    return 2;
  }
  std::vector<std::string> warnings;
  Result<engine::EngineConfig> cfg = config_path.empty()
                                         ? engine::parse_config(nlohmann::json::parse(kDefaultConfig), &warnings)
                                         : engine::load_config(config_path, &warnings);
  exit_on_error(cfg.status(), "strata-train");
  for (const std::string& w : warnings) std::fprintf(stderr, "strata-train: warning: %s\n", w.c_str());
  if (steps < 0) steps = cfg->steps;
  Result<engine::TrainerOptions> from_config = engine::trainer_options(*cfg);
  exit_on_error(from_config.status(), "strata-train");
  engine::TrainerOptions o = std::move(from_config).value();
  o.vertical_accumulation = o.vertical_accumulation || vertical;
  if (o.vertical_accumulation && o.grad_accum > 1) {
    std::printf("vertical accumulation: the %lld micro-batches of each block run while its weights are on the device\n",
                static_cast<long long>(o.grad_accum));
  }
  o.delayed_update = delayed || cfg->delayed_update;
  if (o.delayed_update) std::printf("delayed parameter update: each step computes with weights one update stale\n");
  if (!nvme.empty()) {
    o.states = engine::Tier::kNvme;
    o.nvme_paths = {nvme};
    if (!cfg->nvme_budget_given) {  // the budget is --nvme's free space, not the config's directories'
      Result<uint64_t> free = engine::nvme_free_bytes(o.nvme_paths);
      exit_on_error(free.status().with_context("--nvme"), "strata-train");
      cfg->budgets.nvme_bytes = *free;
    }
  }
  if (sub_group >= 0) {
    o.state_piece_elems = sub_group;
    exit_on_error(engine::check_state_piece_elems(o.state_piece_elems).with_context("--sub-group-size"),
                  "strata-train");
  }
  o.speculate_in_ram = (speculate_in_ram || cfg->speculate_in_ram) && o.states == engine::Tier::kHost;
  if ((speculate_in_ram || cfg->speculate_in_ram) && !o.speculate_in_ram) {
    std::printf("speculate_in_ram: the states are on NVMe, where speculation keeps its second copy already\n");
  }
  // A config without budgets (a DeepSpeed one, say) gets the host backend's
  // defaults: a 1 GiB device and half the machine's memory.
  bool defaulted = false;
  engine::Budgets budgets = engine::budgets_or_defaults(cfg->budgets, &defaulted);
  if (defaulted) {
    std::printf("budgets not all given in the config; using device %s, host %s\n",
                format_bytes(budgets.device_bytes).c_str(), format_bytes(budgets.host_bytes).c_str());
  }
  o.backend = device == "cuda" ? engine::TrainerOptions::Backend::kCuda : engine::TrainerOptions::Backend::kHost;
  if (!adam_states.empty()) o.adam_states = *cpu_optim::parse_state_type(adam_states);
  o.pin_memory = cfg->pin_memory && !no_pin;
  if (auto_placement) {
    if (stream || speculate_in_ram || weights_on != "host" || activations != "device" || prefetch != 1) {
      std::fprintf(stderr, "strata-train: --auto-placement chooses the placement itself; drop --stream-weights, "
                           "--weights-on, --activations-on, --prefetch and --speculate-in-ram\n");
      return 2;
    }
    // The planner over every tier the run has, within the config's own
    // constraints; what it picks is what runs.
    std::vector<std::string> paths = nvme.empty() ? cfg->nvme_paths : std::vector<std::string>{nvme};
    engine::Constraints fixed = cfg->constraints;
    if (!nvme.empty()) fixed.states = std::nullopt;  // --nvme makes NVMe available, the planner decides
    Result<engine::Plan> chosen = engine::apply_planned_placement(&o, budgets, fixed, paths);
    if (!chosen && paths.empty()) {
      std::fprintf(stderr, "strata-train: --auto-placement: %s (no NVMe tier: --nvme DIR gives the planner one)\n",
                   chosen.error().to_string().c_str());
      return 1;
    }
    exit_on_error(chosen.status().with_context("--auto-placement"), "strata-train");
    // The plan's placement, as the flags below would have said it.
    stream = o.stream_weights;
    weights_on = o.weights == engine::Tier::kNvme ? "nvme" : "host";
    activations = std::string(engine::tier_name(o.activation_checkpoints));
    prefetch = o.prefetch_depth;
    auto_why = chosen->why;
    std::printf("auto placement: %s\n", auto_why.c_str());
  }
  if (!auto_placement) {
    // The config's placement (its placement keys, DeepSpeed's offload_param)
    // where no flag says otherwise: weights kept off the device stream.
    const engine::Constraints& want = cfg->constraints;
    if (want.weights && *want.weights != engine::Tier::kDevice) {
      stream = true;
      if (app.count("--weights-on") == 0) weights_on = std::string(engine::tier_name(*want.weights));
    }
    if (want.checkpoints && app.count("--activations-on") == 0) {
      activations = std::string(engine::tier_name(*want.checkpoints));
    }
  }
  o.stream_weights = stream;
  o.device_bytes = stream || device == "cuda" ? budgets.device_bytes : 0;
  o.host_budget_bytes = budgets.host_bytes;  // held at run time, as the device's
  o.nvme_budget_bytes = budgets.nvme_bytes;
  o.prefetch_depth = prefetch;
  o.activation_checkpoints = activations == "host"   ? engine::Tier::kHost
                             : activations == "nvme" ? engine::Tier::kNvme
                                                     : engine::Tier::kDevice;
  if (o.activation_checkpoints != engine::Tier::kDevice && !stream) {
    std::fprintf(stderr, "strata-train: --activations-on %s needs --stream-weights\n", activations.c_str());
    return 2;
  }
  if (weights_on == "nvme" || cfg->constraints.weights == engine::Tier::kNvme) {
    if (!stream || o.states != engine::Tier::kNvme) {
      std::fprintf(stderr, "strata-train: weights on NVMe need --stream-weights and the optimizer states on NVMe (--nvme DIR)\n");
      return 2;
    }
    o.weights = engine::Tier::kNvme;
  }
  if (o.activation_checkpoints == engine::Tier::kNvme && o.nvme_paths.empty()) {
    std::fprintf(stderr, "strata-train: --activations-on nvme needs --nvme DIR\n");
    return 2;
  }
  // The planner's view of the same run: the estimate of the placement this
  // run uses, and, when the planner would pick another, that one too.
  engine::TrainSetup setup = engine::training_setup(o);
  const engine::Placement run_placement{stream ? o.weights : engine::Tier::kDevice,
                                        o.states,
                                        o.activation_checkpoints,
                                        stream ? prefetch : 1,
                                        o.speculate_in_ram,
                                        engine::micro_batches_per_pass(o)};
  engine::Plan plan = engine::estimate(setup, run_placement, engine::Bandwidths{});
  plan.why = !auto_why.empty() ? auto_why + " (the placement this run uses: --auto-placement)"
                               : engine::placement_text(run_placement) +
                                     (stream ? ", prefetch depth " + std::to_string(prefetch) : std::string()) +
                                     ": the placement this run uses (its flags and config)";
  std::printf("Adam states: %s m and v (%.2f bytes per parameter, with the fp32 master weights %.2f)\n",
              std::string(cpu_optim::state_type_name(o.adam_states)).c_str(), setup.state_bytes_per_param,
              4.0 + setup.state_bytes_per_param);
  std::printf("%s", engine::format_plan(plan, budgets).c_str());
  const bool fits = engine::fits(plan, budgets);
  if (auto_why.empty()) {
    engine::Constraints fixed;
    fixed.states = o.states;
    Result<engine::Plan> best = engine::make_plan(setup, budgets, engine::Bandwidths{}, fixed);
    if (!best) {
      std::printf("planner: %s\n", best.error().to_string().c_str());
    } else if (best->placement != run_placement && (!fits || best->step_seconds < plan.step_seconds * (1 - 1e-9))) {
      std::printf("planner: %s, predicted %.4f s a step against this placement's %.4f s%s (--auto-placement runs it)\n",
                  best->why.c_str(), best->step_seconds, plan.step_seconds, fits ? "" : ", which does not fit");
    }
  }
  if (plan_only) {
    std::printf("plan only: %s\n", fits ? "fits the budgets" : "does not fit the budgets");
    return fits ? 0 : 1;
  }
  // Outputs written after the run: a wrong path fails now, not after it.
  if (!checkpoint.empty()) exit_on_error(engine::CheckpointDir(checkpoint).check_writable(), "strata-train");
  if (!trace_path.empty()) {
    exit_on_error(
        check_directory_writable(std::filesystem::path(trace_path).parent_path().string()).with_context("--trace"),
        "strata-train");
  }
  std::optional<engine::TokenFile> data;
  if (!data_path.empty()) {
    Result<engine::TokenFile> f = engine::TokenFile::open(data_path, *engine::parse_token_width(data_type), o.seq);
    exit_on_error(f.status().with_context("--data"), "strata-train");
    data.emplace(std::move(f).value());
    std::printf("data: %s, %lld tokens (%s)\n", data_path.c_str(), static_cast<long long>(data->tokens()),
                data_type.c_str());
  }
  engine::Trace trace(!trace_path.empty());
  if (trace.enabled()) o.trace = &trace;
  ProgressLines progress;
  o.progress = std::ref(progress);
  Result<std::unique_ptr<engine::Trainer>> tr = engine::Trainer::create(o);
  exit_on_error(tr.status(), "strata-train");
  if (resume) {
    exit_on_error((*tr)->load(checkpoint), "strata-train");
    std::printf("resumed from %s at step %lld\n", checkpoint.c_str(), static_cast<long long>((*tr)->steps_done()));
    if ((*tr)->steps_done() >= steps) {
      std::printf("nothing to run: the checkpoint is at step %lld, --steps asks for %lld\n",
                  static_cast<long long>((*tr)->steps_done()), static_cast<long long>(steps));
    }
  }
  const double tokens = static_cast<double>(o.batch * o.seq * o.grad_accum);
  const double flops = gpu::training_flops_per_token(o.model, o.seq, /*recompute=*/false) * tokens;
  float first = 0, last = 0;
  double total_s = 0;
  uint64_t nvme_bytes = 0, ssd_written = 0;
  double idle_sum = 0;
  // The token file's micro-batches for step i: grad_accum x batch x seq,
  // micro-batch index i x grad_accum + k (the checkpoint's data position).
  std::vector<int32_t> batch_tokens(static_cast<size_t>(o.grad_accum * o.batch * o.seq)),
      batch_targets(batch_tokens.size());
  auto step_on = [&](const engine::TokenFile& f, int64_t i) -> Result<float> {
    const size_t mb = static_cast<size_t>(o.batch * o.seq);
    for (int64_t k = 0; k < o.grad_accum; ++k) {
      const size_t at = static_cast<size_t>(k) * mb;
      STRATA_RETURN_IF_ERROR(f.micro_batch(i * o.grad_accum + k, o.batch, o.model.vocab,
                                           std::span(batch_tokens).subspan(at, mb),
                                           std::span(batch_targets).subspan(at, mb)));
    }
    return (*tr)->step(batch_tokens, batch_targets);
  };
  const int64_t start = (*tr)->steps_done();
  int64_t saved_at = resume ? start : -1;  // the step of the checkpoint last written (or loaded)
  std::signal(SIGINT, request_stop);
  std::signal(SIGTERM, request_stop);
  for (int64_t i = start; i < steps && g_stop_signal == 0; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    Result<float> loss = data ? step_on(*data, i) : (*tr)->step();
    exit_on_error(loss.status(), "strata-train");
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    total_s += s;
    if (i == start) first = *loss;
    last = *loss;
    const engine::StageCounters& st = (*tr)->last_stage();
    const engine::StepCounters& k = (*tr)->last_counters();
    nvme_bytes += k.nvme_read_bytes + k.nvme_written_bytes;
    ssd_written += k.nvme_written_bytes;
    idle_sum += k.device_idle_fraction;
    std::string scale;
    if (o.precision == DType::kF16) scale = " | loss scale 2^" + std::to_string(std::ilogb((*tr)->loss_scale()));
    std::printf(
        "step %5lld | loss %.4f | lr %.3g | grad norm %8.3f%s%s | %8.0f tok/s | %6.2f GFLOP/s | "
        "optimizer %6.1f ms | device idle %4.1f%% | h2d/d2h %s/%s | nvme r/w %s/%s\n",
        static_cast<long long>(i + 1), *loss, (*tr)->last_lr(), (*tr)->last_grad_norm(),
        (*tr)->last_skipped()   ? " (inf/nan: skipped)"
        : (*tr)->last_clipped() ? " (clipped)"
                                : "",
        scale.c_str(), tokens / s, flops / s / 1e9, st.seconds * 1e3, 100 * k.device_idle_fraction,
        format_bytes(k.h2d_bytes).c_str(), format_bytes(k.d2h_bytes).c_str(), format_bytes(k.nvme_read_bytes).c_str(),
        format_bytes(k.nvme_written_bytes).c_str());
    std::fflush(stdout);
    if (!checkpoint.empty() && save_every > 0 && (i + 1) % save_every == 0) {
      exit_on_error((*tr)->save(checkpoint), "strata-train");
      saved_at = i + 1;
    }
  }
  const int stop_signal = g_stop_signal;
  if (stop_signal != 0) {
    std::printf("stopping after step %lld: %s%s\n", static_cast<long long>((*tr)->steps_done()),
                stop_signal == SIGINT ? "SIGINT" : "SIGTERM",
                checkpoint.empty() ? " (no --checkpoint: nothing saved)" : ", saving a checkpoint");
    std::fflush(stdout);
  }
  if (!checkpoint.empty()) {
    // The last step's checkpoint, unless it was just written (or loaded).
    if (saved_at != (*tr)->steps_done()) exit_on_error((*tr)->save(checkpoint), "strata-train");
    std::printf("checkpoint: %s\n", engine::CheckpointDir(checkpoint).latest()->path.c_str());
  }
  if (trace.enabled()) {
    exit_on_error(trace.write(trace_path), "strata-train");
    std::printf("trace: %s (%zu events)\n", trace_path.c_str(), trace.size());
  }
  const int64_t ran = (*tr)->steps_done() - start;
  nlohmann::json j = {{"bench", "train"}, {"steps", ran}, {"first_loss", first}, {"last_loss", last},
                      {"tokens_per_s", ran > 0 ? tokens * ran / total_s : 0.0},
                      {"parameters", gpu::parameter_count(o.model)},
                      {"states", std::string(engine::tier_name(o.states))},
                      {"adam_states", std::string(cpu_optim::state_type_name(o.adam_states))},
                      {"weights", std::string(engine::tier_name(o.weights))}, {"nvme_bytes", nvme_bytes},
                      {"ssd_bytes_written", ssd_written},
                      {"device_idle_fraction", ran > 0 ? idle_sum / static_cast<double>(ran) : 0.0},
                      {"stream_weights", stream}, {"device", device},
                      {"system", system_info()}};
  if ((*tr)->device() != nullptr) j["device_peak_bytes"] = (*tr)->device()->peak_bytes();
  std::printf("%s\n", j.dump().c_str());
  return stop_signal != 0 ? 128 + stop_signal : 0;  // as a shell reports a process the signal ended
}

}  // namespace
}  // namespace strata::bench

int main(int argc, char** argv) { return strata::bench::run(argc, argv); }
