// The C API (include/strata/strata.h) over engine::Trainer: a config's text
// to a planned trainer (engine/trainer_config.h), steps on the caller's
// tokens, checkpoints, a description, and the plan alone. Every entry point
// turns a Status or an exception into a strata_status and this thread's
// last error; nothing throws across the C boundary.
#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <new>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <vector>

#include "bindings/c_status.h"
#include "bindings/include/strata/strata.h"
#include "common/status.h"
#include "engine/config.h"
#include "engine/plan.h"
#include "models/gpt/trainer.h"
#include "models/gpt/trainer_config.h"

namespace strata::bindings {

std::string& last_error() {
  thread_local std::string message;
  return message;
}

Result<nlohmann::json> parse_config_text(const char* call, const char* config_json) {
  if (config_json == nullptr) return invalid_argument(std::string(call) + ": config_json is NULL");
  nlohmann::json j = nlohmann::json::parse(config_json, nullptr, /*allow_exceptions=*/false, /*ignore_comments=*/true);
  if (j.is_discarded()) return invalid_argument(std::string(call) + ": the config is not valid JSON");
  return j;
}

Status copy_text(const char* call, const std::string& s, char* text, size_t capacity, size_t* length) {
  if (text == nullptr && capacity > 0) return invalid_argument(std::string(call) + ": text is NULL, capacity not 0");
  if (capacity > 0) {
    const size_t n = std::min(s.size(), capacity - 1);
    std::memcpy(text, s.data(), n);
    text[n] = '\0';
  }
  if (length != nullptr) *length = s.size();
  return ok_status();
}

}  // namespace strata::bindings

namespace {

using strata::Result;
using strata::Status;
using strata::StatusCode;
using strata::bindings::guarded;
using strata::bindings::report;
namespace engine = strata::engine;

static_assert(STRATA_BUILD_VERSION_MAJOR == STRATA_VERSION_MAJOR && STRATA_BUILD_VERSION_MINOR == STRATA_VERSION_MINOR &&
                  STRATA_BUILD_VERSION_PATCH == STRATA_VERSION_PATCH,
              "strata.h's STRATA_VERSION_* differ from CMakeLists.txt's project(VERSION)");
static_assert(static_cast<int>(StatusCode::kOk) == STRATA_OK);
static_assert(static_cast<int>(StatusCode::kInvalidArgument) == STRATA_INVALID_ARGUMENT);
static_assert(static_cast<int>(StatusCode::kNotFound) == STRATA_NOT_FOUND);
static_assert(static_cast<int>(StatusCode::kFailedPrecondition) == STRATA_FAILED_PRECONDITION);
static_assert(static_cast<int>(StatusCode::kResourceExhausted) == STRATA_RESOURCE_EXHAUSTED);
static_assert(static_cast<int>(StatusCode::kUnavailable) == STRATA_UNAVAILABLE);
static_assert(static_cast<int>(StatusCode::kDataLoss) == STRATA_DATA_LOSS);
static_assert(static_cast<int>(StatusCode::kCancelled) == STRATA_CANCELLED);
static_assert(static_cast<int>(StatusCode::kUnimplemented) == STRATA_UNIMPLEMENTED);
static_assert(static_cast<int>(StatusCode::kInternal) == STRATA_INTERNAL);

// A config's text and a device name, as a trainer's options with the
// planner's placement applied.
struct Prepared {
  engine::TrainerOptions options;
  engine::Budgets budgets;
  engine::Plan plan;
  std::vector<std::string> warnings;
};

Result<Prepared> prepare(const char* config_json, const char* device) {
  STRATA_ASSIGN_OR_RETURN(const nlohmann::json j, strata::bindings::parse_config_text("strata", config_json));
  Prepared p;
  STRATA_ASSIGN_OR_RETURN(engine::GptRunConfig run, engine::parse_gpt_config(j, &p.warnings));
  STRATA_ASSIGN_OR_RETURN(p.options, engine::trainer_options(run, &p.warnings));
  const engine::EngineConfig& cfg = run.engine;
  const std::string dev = device == nullptr ? "host" : device;
  if (dev == "cuda") {
    p.options.backend = engine::TrainerOptions::Backend::kCuda;
  } else if (dev != "host") {
    return strata::invalid_argument("strata: device \"" + dev + "\" is not one of host, cuda");
  }
  p.budgets = engine::budgets_or_defaults(cfg.budgets);
  STRATA_ASSIGN_OR_RETURN(p.plan,
                          engine::apply_planned_placement(&p.options, p.budgets, cfg.constraints, cfg.nvme_paths,
                                                          &p.warnings));
  return p;
}

}  // namespace

struct strata_trainer {
  Prepared prepared;
  std::unique_ptr<engine::Trainer> trainer;
  std::string description;  // strata_trainer_describe's last answer
  std::atomic<bool> aborted{false};  // strata_trainer_abort: later calls are Cancelled
};

namespace {

// NULL or aborted: the error a call on `t` returns instead of acting.
Status usable(const strata_trainer* t, const char* call) {
  if (t == nullptr) return strata::invalid_argument(std::string(call) + ": trainer is NULL");
  if (t->aborted.load(std::memory_order_acquire)) {
    return Status(StatusCode::kCancelled, std::string(call) + ": the trainer was aborted (strata_trainer_abort)");
  }
  return strata::ok_status();
}

}  // namespace

extern "C" {

void strata_get_version(int* major, int* minor, int* patch) {
  // The build's project version (CMake), which a test holds equal to the header's.
  if (major != nullptr) *major = STRATA_BUILD_VERSION_MAJOR;
  if (minor != nullptr) *minor = STRATA_BUILD_VERSION_MINOR;
  if (patch != nullptr) *patch = STRATA_BUILD_VERSION_PATCH;
}

strata_status strata_check_version(int major, int minor) {
  return guarded([&]() -> Status {
    if (major == STRATA_BUILD_VERSION_MAJOR && minor <= STRATA_BUILD_VERSION_MINOR && minor >= 0) {
      return strata::ok_status();
    }
    return strata::failed_precondition(
        "strata_check_version: this program was built against strata " + std::to_string(major) + "." +
        std::to_string(minor) + ", and the library loaded is " + std::to_string(STRATA_BUILD_VERSION_MAJOR) + "." +
        std::to_string(STRATA_BUILD_VERSION_MINOR) + "." + std::to_string(STRATA_BUILD_VERSION_PATCH) +
        " (it serves programs built against " + std::to_string(STRATA_BUILD_VERSION_MAJOR) + ".0 to " +
        std::to_string(STRATA_BUILD_VERSION_MAJOR) + "." + std::to_string(STRATA_BUILD_VERSION_MINOR) + ")");
  });
}

const char* strata_last_error(void) {
  return strata::bindings::last_error().c_str();
}

const char* strata_status_name(strata_status status) {
  static const char* const kNames[] = {
      "OK",          "INVALID_ARGUMENT", "NOT_FOUND", "FAILED_PRECONDITION", "RESOURCE_EXHAUSTED",
      "UNAVAILABLE", "DATA_LOSS",        "CANCELLED", "UNIMPLEMENTED",       "INTERNAL"};
  const int i = static_cast<int>(status);
  return i >= 0 && i < static_cast<int>(std::size(kNames)) ? kNames[i] : "UNKNOWN";
}

strata_status strata_trainer_create(const char* config_json, const char* device, strata_trainer** out) {
  return guarded([&]() -> Status {
    if (out == nullptr) return strata::invalid_argument("strata_trainer_create: out is NULL");
    *out = nullptr;
    STRATA_ASSIGN_OR_RETURN(Prepared p, prepare(config_json, device));
    auto t = std::make_unique<strata_trainer>();
    t->prepared = std::move(p);
    STRATA_ASSIGN_OR_RETURN(t->trainer, engine::Trainer::create(t->prepared.options));
    *out = t.release();
    return strata::ok_status();
  });
}

strata_status strata_trainer_resume(const char* config_json, const char* device, const char* dir,
                                    strata_trainer** out) {
  return guarded([&]() -> Status {
    if (out == nullptr) return strata::invalid_argument("strata_trainer_resume: out is NULL");
    *out = nullptr;
    if (dir == nullptr) return strata::invalid_argument("strata_trainer_resume: dir is NULL");
    STRATA_ASSIGN_OR_RETURN(Prepared p, prepare(config_json, device));
    auto t = std::make_unique<strata_trainer>();
    t->prepared = std::move(p);
    t->prepared.options.initial_state = false;  // the load sets every weight and state
    STRATA_ASSIGN_OR_RETURN(t->trainer, engine::Trainer::create(t->prepared.options));
    STRATA_RETURN_IF_ERROR(t->trainer->load(dir));
    *out = t.release();
    return strata::ok_status();
  });
}

void strata_trainer_destroy(strata_trainer* trainer) {
  delete trainer;
}

strata_status strata_trainer_finalize(strata_trainer* trainer) {
  return guarded([&]() -> Status {
    STRATA_RETURN_IF_ERROR(usable(trainer, "strata_trainer_finalize"));
    return trainer->trainer->finalize();
  });
}

strata_status strata_trainer_async_error(strata_trainer* trainer) {
  return guarded([&]() -> Status {
    if (trainer == nullptr) return strata::invalid_argument("strata_trainer_async_error: trainer is NULL");
    return trainer->trainer->async_error();
  });
}

strata_status strata_trainer_abort(strata_trainer* trainer) {
  return guarded([&]() -> Status {
    if (trainer == nullptr) return strata::invalid_argument("strata_trainer_abort: trainer is NULL");
    trainer->aborted.store(true, std::memory_order_release);
    return strata::ok_status();
  });
}

strata_status strata_trainer_shape(const strata_trainer* trainer, strata_shape* shape) {
  return guarded([&]() -> Status {
    if (trainer == nullptr) return strata::invalid_argument("strata_trainer_shape: trainer is NULL");
    const engine::TrainerOptions& o = trainer->prepared.options;
    return strata::bindings::write_struct("strata_trainer_shape", "shape",
                        strata_shape{sizeof(strata_shape), o.grad_accum, o.batch, o.seq, o.model.vocab}, shape);
  });
}

strata_status strata_trainer_step(strata_trainer* trainer, const int32_t* tokens, const int32_t* targets, size_t count,
                                  float* loss) {
  return guarded([&]() -> Status {
    STRATA_RETURN_IF_ERROR(usable(trainer, "strata_trainer_step"));
    Result<float> l = 0.0f;
    if (tokens == nullptr && targets == nullptr && count == 0) {
      l = trainer->trainer->step();
    } else if (tokens == nullptr || targets == nullptr) {
      return strata::invalid_argument(
          "strata_trainer_step: tokens and targets must both be given (or both NULL, "
          "with count 0, for the synthetic stream)");
    } else {
      l = trainer->trainer->step(std::span(tokens, count), std::span(targets, count));
    }
    if (!l) return std::move(l).error();
    if (loss != nullptr) *loss = *l;
    return strata::ok_status();
  });
}

int64_t strata_trainer_steps_done(const strata_trainer* trainer) {
  return trainer == nullptr ? 0 : trainer->trainer->steps_done();
}

strata_status strata_trainer_save(strata_trainer* trainer, const char* dir) {
  return guarded([&]() -> Status {
    STRATA_RETURN_IF_ERROR(usable(trainer, "strata_trainer_save"));
    if (dir == nullptr) return strata::invalid_argument("strata_trainer_save: dir is NULL");
    return trainer->trainer->save(dir);
  });
}

strata_status strata_trainer_load(strata_trainer* trainer, const char* dir) {
  return guarded([&]() -> Status {
    STRATA_RETURN_IF_ERROR(usable(trainer, "strata_trainer_load"));
    if (dir == nullptr) return strata::invalid_argument("strata_trainer_load: dir is NULL");
    return trainer->trainer->load(dir);
  });
}

const char* strata_trainer_describe(strata_trainer* trainer) {
  if (trainer == nullptr) return nullptr;
  try {
    const Prepared& p = trainer->prepared;
    const engine::Trainer& tr = *trainer->trainer;
    const engine::StepCounters& k = tr.last_counters();
    nlohmann::json j = {{"parameters", strata::gpt::parameter_count(p.options.model)},
                        {"placement", p.plan.why},
                        {"plan", engine::format_plan(p.plan, p.budgets)},
                        {"warnings", p.warnings},
                        {"steps_done", tr.steps_done()},
                        {"updates_done", tr.updates_done()},
                        {"last",
                         {{"lr", tr.last_lr()},
                          {"grad_norm", tr.last_grad_norm()},
                          {"clipped", tr.last_clipped()},
                          {"skipped", tr.last_skipped()},
                          {"loss_scale", tr.loss_scale()},
                          {"h2d_bytes", k.h2d_bytes},
                          {"d2h_bytes", k.d2h_bytes},
                          {"nvme_read_bytes", k.nvme_read_bytes},
                          {"nvme_written_bytes", k.nvme_written_bytes},
                          {"device_idle_fraction", k.device_idle_fraction}}}};
    trainer->description = j.dump();
  } catch (const std::exception& e) {
    report(strata::internal_error(std::string("strata_trainer_describe: ") + e.what()));
    trainer->description = "{}";
  }
  return trainer->description.c_str();
}

strata_status strata_plan(const char* config_json, const char* device, char* text, size_t capacity, size_t* length,
                          int* fits) {
  return guarded([&]() -> Status {
    if (text == nullptr && capacity > 0) return strata::invalid_argument("strata_plan: text is NULL, capacity not 0");
    STRATA_ASSIGN_OR_RETURN(Prepared p, prepare(config_json, device));
    STRATA_RETURN_IF_ERROR(
        strata::bindings::copy_text("strata_plan", engine::format_plan(p.plan, p.budgets), text, capacity, length));
    if (fits != nullptr) *fits = engine::fits(p.plan, p.budgets) ? 1 : 0;
    return strata::ok_status();
  });
}

}  // extern "C"
