// `strata capacity`: for the device given (the host backend capped at
// --device-budget, or a CUDA GPU) and the host and NVMe budgets, the largest
// GPT of a growing family (layers and hidden together, heads of 64) that
// trains in each offload mode: found by the planner, then trained for a few
// steps on the synthetic stream, with its measured step time and peak bytes
// per tier printed beside the planner's prediction. --plan-only stops after
// planning, for hardware one does not have.
//
// The modes: 1 everything on the device (the host backend's optimizer runs
// on the CPU, so the states are counted against the device budget instead:
// the device's memory holds what a GPU's would), 2 master weights and Adam
// states on the host, 3 the weights streamed from the host too, 4 the states
// on NVMe, 5 weights, states, gradients and saved activations on NVMe.
#include "tools/capacity_command.h"
#include "tools/arithmetic_data.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "common/path_check.h"
#include "common/units.h"
#include "engine/calibrate.h"
#include "engine/config.h"
#include "engine/plan.h"
#include "gpu/device_factory.h"
#include "io/file.h"
#include "models/gpt/trainer.h"
#include "models/gpt/trainer_config.h"
#include "tools/arithmetic_data.h"

namespace strata::tools {
namespace {

using engine::Tier;

struct Mode {
  int id;
  const char* key;
  const char* title;
  engine::Constraints fixed;
  bool states_on_device;  // mode 1: the states are counted on the device
  bool needs_nvme;
};

std::vector<Mode> modes() {
  auto fixed = [](Tier w, Tier s, std::optional<Tier> ck = std::nullopt, std::optional<Tier> g = std::nullopt) {
    engine::Constraints c;
    c.weights = w;
    c.states = s;
    c.activations = ck;
    c.gradients = g;
    return c;
  };
  // Mode 1's states stand for a GPU-resident optimizer's: one copy.
  engine::Constraints resident = fixed(Tier::kDevice, Tier::kHost, Tier::kDevice);
  resident.allow_speculate_in_ram = false;
  return {
      {1, "no_offload", "no offload (everything on the device)", resident, true, false},
      {2, "states_on_host", "master weights and Adam states on the host", fixed(Tier::kDevice, Tier::kHost), false,
       false},
      {3, "weights_from_host", "weights streamed from the host too", fixed(Tier::kHost, Tier::kHost), false, false},
      {4, "states_on_nvme", "Adam states on NVMe", fixed(Tier::kHost, Tier::kNvme), false, true},
      {5, "all_on_nvme", "weights, states, gradients, activations on NVMe",
       fixed(Tier::kNvme, Tier::kNvme, Tier::kNvme, Tier::kNvme), false, true},
  };
}

// The family, smallest first by parameters: GPT-2's (12x768, 24x1024,
// 36x1280, 48x1600) and GPT-3's (... 24x1536, 24x2048, 32x2560, 32x4096,
// 40x5120, 96x12288) shapes, and smaller ones in their proportions (layers
// and hidden grow together; heads of 64). What a device must hold grows
// with the width, not with the parameters, so every shape is tried.
struct Shape {
  int64_t layers, hidden;
};
const Shape kFamily[] = {{2, 64},    {2, 128},   {4, 128},   {4, 192},   {6, 256},   {8, 256},   {8, 384},
                         {8, 512},   {12, 512},  {12, 640},  {12, 768},  {16, 768},  {16, 1024}, {24, 1024},
                         {24, 1280}, {24, 1536}, {36, 1280}, {36, 1600}, {24, 2048}, {48, 1600}, {32, 2560},
                         {32, 3072}, {32, 4096}, {40, 4096}, {40, 5120}, {48, 6144}, {64, 8192}, {80, 8192},
                         {96, 12288}};

struct Flags {
  std::string device = "host";
  // Empty: 512 MiB on the host backend, the GPU's free memory on CUDA; half
  // the RAM; the NVMe directory's free space.
  std::string device_budget, host_budget, nvme_dir, nvme_budget;
  int64_t seq = 0, micro_batch = 0, steps = 3, vocab = 256;  // seq, micro_batch: 0 is the device's default
  double lr = 0;  // 0: lr_for(parameters)
  std::vector<int> modes = {1, 2, 3, 4, 5};
  bool plan_only = false;
  std::string json_path, csv_path, plot_path;
};

// One mode's answer: the shape the planner found, its plan, and what the
// training measured.
struct Row {
  const Mode* mode = nullptr;
  std::optional<Shape> shape;
  engine::Plan plan;
  uint64_t predicted_device = 0;  // mode 1: with the states
  bool trained = false, ran = false;
  int64_t steps = 0;
  double step_s = 0, tokens_per_s = 0, tflops = 0;
  double predicted_tokens_per_s = 0, predicted_tflops = 0;  // at the planner's step time
  float first_loss = 0, last_loss = 0;
  uint64_t peak_device = 0, peak_host = 0, peak_nvme = 0;
  std::string note;
};

// The planner's rates for a shape: measured on the device (a block of the
// shape's width through the backend's own ops, its copies, the CPU
// optimizer), or the defaults when the device is not here (--plan-only
// for a GPU one does not have).
engine::Bandwidths rates_for(const engine::TrainSetup& setup, const Flags& f) {
  gpu::DeviceSpec spec;
  spec.backend = f.device == "cuda" ? gpu::Backend::kCuda : gpu::Backend::kHost;
  Result<std::unique_ptr<gpu::Device>> dev = gpu::make_device(spec);
  engine::Bandwidths bw;
  if (!dev) {
    bw.source = "defaults: " + std::string(dev.status().message());
    return bw;
  }
  engine::CalibrateOptions co;
  co.host_backend = spec.backend == gpu::Backend::kHost;
  if (!f.nvme_dir.empty()) co.nvme_paths = {f.nvme_dir};
  Result<engine::Bandwidths> measured = engine::measure_bandwidths(**dev, setup, co);
  if (!measured) {
    bw.source = "defaults: " + std::string(measured.status().message());
    return bw;
  }
  return *measured;
}

gpt::GptConfig model_of(const Shape& s, const Flags& f) {
  gpt::GptConfig m;
  m.layers = s.layers;
  m.hidden = s.hidden;
  m.heads = std::max<int64_t>(1, s.hidden / 64);
  m.vocab = f.vocab;
  m.max_seq = f.seq;
  return m;
}

// A learning rate for a few steps without warm-up: 1e-3 up to 10M
// parameters, then 1e-3 x 10M / n (1.4e-5 at 700M). Adam's first updates
// move every parameter by about the rate, so their effect on the loss
// grows with the parameter count: GPT-3's rates by size (2.5e-4 at 760M),
// meant after a warm-up, overshoot from the second step on a 700M model.
double lr_for(int64_t n) { return 1e-3 * std::min(1.0, 1e7 / static_cast<double>(n)); }

// The trainer's options for a shape: the config's defaults, this run's
// batch, AdamW at a rate small models learn quickly with.
Result<engine::TrainerOptions> options_of(const Shape& s, const Flags& f, const engine::Budgets& b) {
  const gpt::GptConfig m = model_of(s, f);
  nlohmann::json j = {{"model",
                       {{"layers", m.layers},
                        {"hidden", m.hidden},
                        {"heads", m.heads},
                        {"vocab", m.vocab},
                        {"max_seq", m.max_seq}}},
                      {"batch", {{"micro_batch", f.micro_batch}, {"seq", f.seq}}},
                      {"optimizer",
                       {{"type", "adamw"},
                        {"lr", f.lr > 0 ? f.lr : lr_for(gpt::parameter_count(m))},
                        {"weight_decay", 0.01}}},
                      {"budgets", {{"device", b.device_bytes}, {"host", b.host_bytes}}},
                      {"pin_memory", false},
                      {"seed", 1}};
  if (!f.nvme_dir.empty()) j["nvme_paths"] = {f.nvme_dir};
  std::vector<std::string> warnings;
  STRATA_ASSIGN_OR_RETURN(engine::GptRunConfig cfg, engine::parse_gpt_config(j, &warnings));
  STRATA_ASSIGN_OR_RETURN(engine::TrainerOptions o, engine::trainer_options(cfg));
  o.backend = f.device == "cuda" ? engine::TrainerOptions::Backend::kCuda : engine::TrainerOptions::Backend::kHost;
  return o;
}

// The planner's answer for one shape in one mode, when it fits.
std::optional<Row> plan_shape(const Mode& mode, const Shape& s, const Flags& f, const engine::Budgets& b,
                              const engine::Bandwidths& bw = {}) {
  Result<engine::TrainerOptions> o = options_of(s, f, b);
  if (!o) return std::nullopt;
  Result<engine::Plan> plan = engine::make_plan(engine::training_setup(*o), b, bw, mode.fixed);
  if (!plan) return std::nullopt;
  Row r;
  r.mode = &mode;
  r.shape = s;
  r.plan = *plan;
  r.predicted_device = plan->device.total() + (mode.states_on_device ? plan->host.model_states : 0);
  if (plan->step_seconds > 0) {
    const double tokens = static_cast<double>(f.micro_batch * f.seq);
    r.predicted_tokens_per_s = tokens / plan->step_seconds;
    r.predicted_tflops =
        gpt::training_flops_per_token(model_of(s, f), f.seq, /*recompute=*/false) * tokens / plan->step_seconds / 1e12;
  }
  if (mode.states_on_device && r.predicted_device > b.device_bytes) return std::nullopt;
  return r;
}

// Measured rates by block width: modes whose largest shapes share a width
// (4 and 5, often) are calibrated once.
using RateCache = std::map<int64_t, engine::Bandwidths>;

// The largest shape of the family that the planner fits in this mode.
Row largest(const Mode& mode, const Flags& f, const engine::Budgets& b, RateCache& rates) {
  Row best;
  best.mode = &mode;
  if (mode.needs_nvme && b.nvme_bytes == 0) {
    best.note = "no NVMe tier (--nvme DIR)";
    return best;
  }
  for (const Shape& s : kFamily) {
    if (std::optional<Row> r = plan_shape(mode, s, f, b)) best = *r;
  }
  if (!best.shape) {
    best.note = "nothing of the family fits";
    return best;
  }
  // Bytes chose the shape; the measured rates time it (and may pick a
  // faster placement among those that fit).
  Result<engine::TrainerOptions> o = options_of(*best.shape, f, b);
  if (o) {
    auto known = rates.find(best.shape->hidden);
    if (known == rates.end()) {
      known = rates.emplace(best.shape->hidden, rates_for(engine::training_setup(*o), f)).first;
    }
    if (std::optional<Row> timed = plan_shape(mode, *best.shape, f, b, known->second)) best = *timed;
  }
  return best;
}

// Trains a row's shape for f.steps steps in its mode; fills what it measured.
Status train_row(Row& r, const Flags& f, const engine::Budgets& b) {
  STRATA_ASSIGN_OR_RETURN(engine::TrainerOptions o, options_of(*r.shape, f, b));
  engine::Budgets run = b;
  if (r.mode->states_on_device) run.device_bytes = b.device_bytes - r.plan.host.model_states;
  const std::vector<std::string> paths = f.nvme_dir.empty() ? std::vector<std::string>{} : std::vector{f.nvme_dir};
  STRATA_RETURN_IF_ERROR(
      engine::apply_planned_placement(&o, run, r.mode->fixed, paths, nullptr, r.plan.bandwidths).status());
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<engine::Trainer> tr, engine::Trainer::create(o));
  const double tokens = static_cast<double>(o.batch * o.seq);
  const double flops = gpt::training_flops_per_token(o.model, o.seq, /*recompute=*/false) * tokens;
  // The built-in arithmetic corpus: a stream whose loss a model lowers
  // from its first updates (13 of 256 bytes ever occur), so a few steps
  // show learning at any size.
  STRATA_ASSIGN_OR_RETURN(ArithmeticData data, ArithmeticData::create(3, o.seed, o.model.vocab));
  std::vector<int32_t> batch_tokens(static_cast<size_t>(o.batch * o.seq)), batch_targets(batch_tokens.size());
  double timed = 0;
  for (int64_t k = 0; k < f.steps; ++k) {
    data.micro_batch(k, o.batch, o.seq, batch_tokens, batch_targets);
    const auto t0 = std::chrono::steady_clock::now();
    STRATA_ASSIGN_OR_RETURN(float loss, tr->step(batch_tokens, batch_targets));
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (k == 0) r.first_loss = loss;
    r.last_loss = loss;
    if (k > 0 || f.steps == 1) timed += s;  // the first step records the access order
    std::printf("  step %lld of %lld: loss %.4f, %.2f s\n", static_cast<long long>(k + 1),
                static_cast<long long>(f.steps), loss, s);
    std::fflush(stdout);
  }
  r.ran = true;
  r.steps = f.steps;
  const double n = static_cast<double>(f.steps > 1 ? f.steps - 1 : 1);
  r.step_s = timed / n;
  r.tokens_per_s = tokens / r.step_s;
  r.tflops = flops / r.step_s / 1e12;
  r.trained = f.steps > 1 && r.last_loss < r.first_loss;
  r.peak_device = tr->device()->peak_bytes() + (r.mode->states_on_device ? r.plan.host.model_states : 0);
  r.peak_host = tr->host_bytes();
  r.peak_nvme = tr->swap_store() != nullptr ? tr->swap_store()->stats().peak_used_bytes : 0;
  return ok_status();
}

std::string shape_text(const Row& r) {
  if (!r.shape) return "-";
  return std::to_string(r.shape->layers) + " x " + std::to_string(r.shape->hidden);
}

std::string params_text(int64_t n) {
  char buf[32];
  if (n >= 1000000000) {
    std::snprintf(buf, sizeof buf, "%.2fB", static_cast<double>(n) / 1e9);
  } else if (n >= 1000000) {
    std::snprintf(buf, sizeof buf, "%.1fM", static_cast<double>(n) / 1e6);
  } else {
    std::snprintf(buf, sizeof buf, "%.0fK", static_cast<double>(n) / 1e3);
  }
  return buf;
}

// "measured (predicted, +e%)" for one tier.
std::string bytes_vs(uint64_t measured, uint64_t predicted, bool ran) {
  if (!ran) return format_bytes(predicted) + " (planned)";
  const double e = predicted > 0 ? 100.0 * (static_cast<double>(predicted) - static_cast<double>(measured)) /
                                       static_cast<double>(std::max<uint64_t>(measured, 1))
                                 : 0.0;
  char buf[96];
  std::snprintf(buf, sizeof buf, "%s (%s, %+.1f%%)", format_bytes(measured).c_str(), format_bytes(predicted).c_str(), e);
  return buf;
}

// The planner's seconds per link for one step, and how they add up to its
// step time: what a row's step time is made of.
std::string links_text(const engine::Plan& plan) {
  std::string text = "plan per step:";
  char buf[64];
  const char* sep = " ";
  for (const engine::LinkTime& l : plan.links) {
    if (l.seconds <= 0) continue;
    std::snprintf(buf, sizeof buf, "%s%s %.2f s", sep, l.link.c_str(), l.seconds);
    text += buf;
    sep = ", ";
  }
  std::snprintf(buf, sizeof buf, " -> step %.2f s (%s)", plan.step_seconds,
                plan.bandwidths.shares_host_cores ? "all but NVMe on the same cores" : "links overlapped");
  return text + buf;
}

void print_table(const std::vector<Row>& rows, int64_t baseline_params) {
  std::printf("\n%-4s %-46s %9s %11s %8s %22s %10s %9s  %s\n", "mode", "", "params", "layers x C", "x mode 1",
              "step s (plan, error)", "tokens/s", "TFLOP/s", "loss first -> last");
  for (const Row& r : rows) {
    if (!r.shape) {
      std::printf("%-4d %-46s %9s  %s\n", r.mode->id, r.mode->title, "-", r.note.c_str());
      continue;
    }
    const int64_t p = r.plan.parameters;
    char ratio[16] = "-", step[40], loss[48] = "-";
    if (baseline_params > 0) std::snprintf(ratio, sizeof ratio, "%.1fx", static_cast<double>(p) / baseline_params);
    std::snprintf(step, sizeof step, "%.3f (%.3f, %+.0f%%)", r.step_s, r.plan.step_seconds,
                  r.step_s > 0 ? 100.0 * (r.plan.step_seconds - r.step_s) / r.step_s : 0.0);
    if (r.ran) {
      std::snprintf(loss, sizeof loss, "%.3f -> %.3f %s", r.first_loss, r.last_loss,
                    r.trained ? "trained" : "NOT trained");
    }
    if (r.ran) {
      std::printf("%-4d %-46s %9s %11s %8s %22s %10.0f %9.4f  %s\n", r.mode->id, r.mode->title,
                  params_text(p).c_str(), shape_text(r).c_str(), ratio, step, r.tokens_per_s, r.tflops, loss);
    } else {  // the planner's figures, in parentheses
      char planned[3][32];
      std::snprintf(planned[0], sizeof planned[0], "- (%.3f)", r.plan.step_seconds);
      std::snprintf(planned[1], sizeof planned[1], "(%.0f)", r.predicted_tokens_per_s);
      std::snprintf(planned[2], sizeof planned[2], "(%.4f)", r.predicted_tflops);
      std::printf("%-4d %-46s %9s %11s %8s %22s %10s %9s  %s\n", r.mode->id, r.mode->title, params_text(p).c_str(),
                  shape_text(r).c_str(), ratio, planned[0], planned[1], planned[2], loss);
    }
  }
  std::printf("\npeak bytes, measured (planned, planner's error):\n");
  std::printf("%-4s %-34s %-34s %-34s\n", "mode", "device", "host", "nvme");
  for (const Row& r : rows) {
    if (!r.shape) continue;
    std::printf("%-4d %-34s %-34s %-34s\n", r.mode->id, bytes_vs(r.peak_device, r.predicted_device, r.ran).c_str(),
                bytes_vs(r.peak_host, r.plan.host.total(), r.ran).c_str(),
                bytes_vs(r.peak_nvme, r.plan.nvme.total(), r.ran).c_str());
  }
  std::fflush(stdout);
}

nlohmann::json row_json(const Row& r) {
  nlohmann::json j = {{"mode", r.mode->key}, {"mode_id", r.mode->id}, {"title", r.mode->title}};
  if (!r.shape) {
    j["params"] = 0;
    j["trained"] = false;
    j["note"] = r.note;
    return j;
  }
  j.update({{"params", r.plan.parameters},
            {"layers", r.shape->layers},
            {"hidden", r.shape->hidden},
            {"trained", r.trained},
            {"steps", r.steps},
            {"step_s", r.step_s},
            {"predicted_step_s", r.plan.step_seconds},
            {"predicted_tokens_per_s", r.predicted_tokens_per_s},
            {"predicted_model_tflops", r.predicted_tflops},
            {"tokens_per_s", r.tokens_per_s},
            {"model_tflops", r.tflops},
            {"placement", r.plan.why},
            {"peak_bytes", {{"device", r.peak_device}, {"host", r.peak_host}, {"nvme", r.peak_nvme}}},
            {"predicted_peak_bytes",
             {{"device", r.predicted_device}, {"host", r.plan.host.total()}, {"nvme", r.plan.nvme.total()}}},
            {"first_loss", r.first_loss},
            {"last_loss", r.last_loss}});
  if (!r.note.empty()) j["note"] = r.note;
  return j;
}

// Draws the rows with tools/capacity_plot.py (Debian's python3-matplotlib),
// from a copy of the JSON beside the PNG.
Status plot(const nlohmann::json& all, const std::string& png) {
  const std::string json = png + ".json.tmp";
  {
    std::ofstream out(json);
    out << all.dump() << "\n";
    if (!out) return unavailable("--plot " + png + ": could not write " + json);
  }
  // Debian's interpreter, which python3-matplotlib installs into, before
  // whatever python3 comes first on PATH.
  const char* python = ::access("/usr/bin/python3", X_OK) == 0 ? "/usr/bin/python3" : "python3";
  const std::string command =
      std::string(python) + " '" STRATA_CAPACITY_PLOT_SCRIPT "' '" + json + "' '" + png + "'";
  const int rc = std::system(command.c_str());
  std::remove(json.c_str());
  if (rc != 0) {
    return unavailable("--plot " + png + ": " STRATA_CAPACITY_PLOT_SCRIPT
                       " failed (python3 and python3-matplotlib are needed: scripts/setup installs them)");
  }
  return ok_status();
}

Status write_outputs(const Flags& f, const std::vector<Row>& rows, const engine::Budgets& b) {
  nlohmann::json all = {{"rows", nlohmann::json::array()},
                        {"machine", bench::system_info()},
                        {"budgets", {{"device", b.device_bytes}, {"host", b.host_bytes}, {"nvme", b.nvme_bytes}}},
                        {"device", f.device},
                        {"seq", f.seq},
                        {"micro_batch", f.micro_batch},
                        {"plan_only", f.plan_only}};
  for (const Row& r : rows) all["rows"].push_back(row_json(r));
  if (!f.json_path.empty()) {
    std::ofstream out(f.json_path);
    out << all.dump(2) << "\n";
    if (!out) return unavailable("--json " + f.json_path + ": could not write it");
    std::printf("json: %s\n", f.json_path.c_str());
  }
  if (!f.plot_path.empty()) STRATA_RETURN_IF_ERROR(plot(all, f.plot_path));
  if (!f.csv_path.empty()) {
    std::ofstream out(f.csv_path);
    out << "mode,params,layers,hidden,trained,step_s,predicted_step_s,tokens_per_s,model_tflops,peak_device,"
           "peak_host,peak_nvme,predicted_device,predicted_host,predicted_nvme,first_loss,last_loss\n";
    for (const nlohmann::json& r : all["rows"]) {
      if (r["params"] == 0) continue;
      out << r["mode"].get<std::string>() << ',' << r["params"] << ',' << r["layers"] << ',' << r["hidden"] << ','
          << (r["trained"].get<bool>() ? "true" : "false") << ',' << r["step_s"] << ',' << r["predicted_step_s"]
          << ',' << r["tokens_per_s"] << ',' << r["model_tflops"] << ',' << r["peak_bytes"]["device"] << ','
          << r["peak_bytes"]["host"] << ',' << r["peak_bytes"]["nvme"] << ',' << r["predicted_peak_bytes"]["device"]
          << ',' << r["predicted_peak_bytes"]["host"] << ',' << r["predicted_peak_bytes"]["nvme"] << ','
          << r["first_loss"] << ',' << r["last_loss"] << '\n';
    }
    if (!out) return unavailable("--csv " + f.csv_path + ": could not write it");
    std::printf("csv: %s\n", f.csv_path.c_str());
  }
  return ok_status();
}

// The budgets from the flags: bytes with units, NVMe's from --nvme's free
// space unless given.
Result<engine::Budgets> budgets_of(const Flags& f) {
  engine::Budgets b;
  auto bytes = [](const std::string& text, const char* flag, uint64_t* out) -> Status {
    if (!parse_bytes(text, out) || *out == 0) {
      return invalid_argument(std::string(flag) + ": \"" + text + "\" is not a size (e.g. 64MiB, 2GiB, 1000000)");
    }
    return ok_status();
  };
  if (!f.device_budget.empty()) {
    STRATA_RETURN_IF_ERROR(bytes(f.device_budget, "--device-budget", &b.device_bytes));
  } else if (f.device == "cuda" && !f.plan_only) {
    gpu::DeviceSpec spec;
    spec.backend = gpu::Backend::kCuda;
    STRATA_ASSIGN_OR_RETURN(std::unique_ptr<gpu::Device> dev, gpu::make_device(spec));
    b.device_bytes = dev->capacity_bytes();
  } else if (f.device == "cuda") {
    return invalid_argument("--plan-only --device cuda needs --device-budget (the GPU's memory)");
  } else {
    b.device_bytes = uint64_t{512} << 20;
  }
  if (!f.host_budget.empty()) {
    STRATA_RETURN_IF_ERROR(bytes(f.host_budget, "--host-budget", &b.host_bytes));
  } else {
    b.host_bytes = physical_memory_bytes() / 2;
  }
  if (!f.nvme_dir.empty()) {
    // The planner alone, given the NVMe tier's size, plans for a drive this
    // machine need not have: the directory is only a name then.
    if (!f.plan_only || f.nvme_budget.empty()) {
      STRATA_RETURN_IF_ERROR(io::check_directory(f.nvme_dir, io::DirectMode::kRequire).with_context("--nvme"));
    }
    if (f.nvme_budget.empty()) {
      STRATA_ASSIGN_OR_RETURN(b.nvme_bytes, engine::nvme_free_bytes({f.nvme_dir}));
    } else {
      STRATA_RETURN_IF_ERROR(bytes(f.nvme_budget, "--nvme-budget", &b.nvme_bytes));
    }
  } else if (!f.nvme_budget.empty()) {
    return invalid_argument("--nvme-budget needs --nvme DIR");
  }
  return b;
}

int run_capacity(Flags f) {
  // The batch's defaults: on the host backend, where compute is a CPU's
  // and every row must train within minutes, one sequence of 64 tokens; on
  // a GPU, four of 1024, as GPT benchmarks use.
  if (f.seq == 0) f.seq = f.device == "cuda" ? 1024 : 64;
  if (f.micro_batch == 0) f.micro_batch = f.device == "cuda" ? 4 : 1;
  Result<engine::Budgets> budgets = budgets_of(f);
  bench::exit_on_error(budgets.status(), "strata capacity");
  // The outputs are written after every mode has trained: a wrong path
  // fails now, not after the work.
  for (const auto& [flag, path] : {std::pair{"--json", &f.json_path}, {"--csv", &f.csv_path}, {"--plot", &f.plot_path}}) {
    if (!path->empty()) bench::exit_on_error(check_output_file(*path, flag), "strata capacity");
  }
  const engine::Budgets& b = *budgets;
  std::printf("strata capacity: device %s (%s), host %s, nvme %s; seq %lld, micro-batch %lld, vocab %lld\n",
              f.device.c_str(), format_bytes(b.device_bytes).c_str(), format_bytes(b.host_bytes).c_str(),
              b.nvme_bytes > 0 ? format_bytes(b.nvme_bytes).c_str() : "none", static_cast<long long>(f.seq),
              static_cast<long long>(f.micro_batch), static_cast<long long>(f.vocab));
  const std::vector<Mode> all = modes();
  std::vector<Row> rows;
  RateCache rates;
  const auto t0 = std::chrono::steady_clock::now();
  // Each mode is planned, then trained at once: its rates are measured in
  // the state its training runs in (after the previous row's), not
  // before every row's training.
  for (size_t i = 0; i < f.modes.size(); ++i) {
    const Mode& m = all.at(static_cast<size_t>(f.modes[i] - 1));
    Row r = largest(m, f, b, rates);
    std::printf("mode %d (%s): %s\n", m.id, m.title,
                r.shape ? (params_text(r.plan.parameters) + " parameters, " + shape_text(r) + ", " + r.plan.why).c_str()
                        : r.note.c_str());
    if (r.shape) {
      std::printf("  rates: %s\n", r.plan.bandwidths.source.c_str());
      std::printf("  %s\n", links_text(r.plan).c_str());
    }
    if (r.shape && !f.plan_only) {
      const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::printf("training mode %d: %s parameters (%s) for %lld steps [%zu of %zu, %.0f s so far]\n", r.mode->id,
                  params_text(r.plan.parameters).c_str(), shape_text(r).c_str(), static_cast<long long>(f.steps), i + 1,
                  f.modes.size(), elapsed);
      std::fflush(stdout);
      Status s = train_row(r, f, b);
      if (!s.ok()) {
        r.note = s.to_string();
        std::printf("  not trained: %s\n", r.note.c_str());
      }
    }
    std::fflush(stdout);
    rows.push_back(r);
  }
  const int64_t baseline = !rows.empty() && rows[0].mode->id == 1 && rows[0].shape ? rows[0].plan.parameters : 0;
  print_table(rows, baseline);
  bench::exit_on_error(write_outputs(f, rows, b), "strata capacity");
  for (const Row& r : rows) {
    if (r.shape && !f.plan_only && !r.trained) return 1;
  }
  return 0;
}

}  // namespace

void add_capacity_command(CLI::App& app) {
  auto f = std::make_shared<Flags>();
  CLI::App* c = app.add_subcommand(
      "capacity", "the largest GPT that trains on this machine in each offload mode: planned, then trained a few steps");
  c->add_option("--device", f->device, "host (the CPU, capped at --device-budget) or cuda (the first GPU)")
      ->check(CLI::IsMember({"host", "cuda"}));
  c->add_option("--device-budget", f->device_budget, "the device's memory (default: 512MiB on host, the GPU's free memory on cuda)");
  c->add_option("--host-budget", f->host_budget, "host RAM for model states and buffers (default: half the RAM)");
  c->add_option("--nvme", f->nvme_dir, "an NVMe directory: modes 4 and 5 (not tmpfs)");
  c->add_option("--nvme-budget", f->nvme_budget, "NVMe space (default: the directory's free space)");
  c->add_option("--seq", f->seq, "sequence length (default 64 on host, 1024 on cuda)")->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  c->add_option("--micro-batch", f->micro_batch, "sequences per step (default 1 on host, 4 on cuda)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  c->add_option("--vocab", f->vocab, "vocabulary (default 256: bytes)")->check(CLI::Range(int64_t{2}, int64_t{1} << 20));
  c->add_option("--steps", f->steps, "optimizer steps per trained row (default 3; the first is not timed)")
      ->check(CLI::Range(int64_t{1}, int64_t{1000}));
  c->add_option("--modes", f->modes, "the modes to answer (default 1 2 3 4 5)")->check(CLI::Range(1, 5))->delimiter(',');
  c->add_option("--lr", f->lr, "AdamW's learning rate for the trained rows (default: 1e-3 x min(1, 10M / parameters))")
      ->check(CLI::Range(1e-8, 1.0));
  c->add_flag("--plan-only", f->plan_only, "the planner's answer alone: nothing is trained");
  c->add_option("--json", f->json_path, "write the rows and the machine as JSON");
  c->add_option("--csv", f->csv_path, "write the rows as CSV");
  c->add_option("--plot", f->plot_path,
                "draw the largest trainable model per mode and its tokens/s into this PNG (python3-matplotlib)");
  c->callback([f] { std::exit(run_capacity(*f)); });
}

}  // namespace strata::tools
