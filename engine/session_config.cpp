#include "engine/session_config.h"

#include <string>
#include <vector>

#include "common/log.h"
#include "common/units.h"
#include "io/device_factory.h"

namespace strata::engine {
// The config's Adam (or AdamW), loss scaling and O_DIRECT mode, as the
// trainer and a session both take them.
cpu_optim::AdamConfig adam_of(const EngineConfig& cfg) {
  cpu_optim::AdamConfig a;
  a.lr = cfg.optimizer.lr;
  a.beta1 = cfg.optimizer.beta1;
  a.beta2 = cfg.optimizer.beta2;
  a.eps = cfg.optimizer.eps;
  a.weight_decay = cfg.optimizer.weight_decay;
  a.decoupled_weight_decay = cfg.optimizer.type == "adamw";
  return a;
}

LossScaleOptions loss_scale_of(const EngineConfig& cfg) {
  LossScaleOptions l;
  l.initial_power = cfg.loss_scaling.initial_scale_power;
  l.window = cfg.loss_scaling.window;
  l.hysteresis = cfg.loss_scaling.hysteresis;
  l.min_scale = cfg.loss_scaling.min_scale;
  return l;
}

io::DirectMode direct_mode(const EngineConfig& cfg) {
  return cfg.io.direct == "off"      ? io::DirectMode::kOff
         : cfg.io.direct == "prefer" ? io::DirectMode::kPrefer
                                     : io::DirectMode::kRequire;
}

namespace {

// The config's choices a session cannot honour, each a sentence naming its
// key: they are the built-in GPT's trainer's, and dropping one silently
// would run something other than what was asked.
std::vector<std::string> unhonoured(const EngineConfig& cfg) {
  std::vector<std::string> w;
  auto say = [&w](const std::string& key, const std::string& why) {
    w.push_back("config key " + key + ": a session does not honour it (" + why + "); ignored");
  };
  if (cfg.vertical_accumulation) say("batch.vertical", "the model orders its own micro-batches");
  return w;
}

}  // namespace

Status take_config(const EngineConfig& cfg, SessionOptions* o) {
  if (cfg.optimizer.type != "adam" && cfg.optimizer.type != "adamw") {
    return invalid_argument("config key optimizer.type: strata runs adam or adamw, the config asks for " +
                            cfg.optimizer.type);
  }
  STRATA_RETURN_IF_ERROR(check_state_piece_elems(cfg.setup.state_piece_elems).with_context("config sub_group_size"));
  if (cfg.setup.grad_accum < 1 || cfg.setup.grad_accum > 4096) {
    return invalid_argument("config key gradient_accumulation_steps: 1..4096 micro-batches a step, got " +
                            std::to_string(cfg.setup.grad_accum));
  }
  STRATA_ASSIGN_OR_RETURN(o->io_backend, io::parse_backend(cfg.io.backend));
  o->adam = adam_of(cfg);
  o->lr_schedule = cfg.lr_schedule;
  o->clip_norm = static_cast<float>(cfg.gradient_clipping);
  o->precision = cfg.setup.compute;
  o->loss_scale = loss_scale_of(cfg);
  o->grad_accum = cfg.setup.grad_accum;
  o->adam_states = cfg.adam_states;
  o->state_piece_elems = cfg.setup.state_piece_elems;
  o->gradient_buffers = cfg.setup.gradient_buffers;
  o->delayed_update = cfg.delayed_update;
  o->numa_node = static_cast<int>(cfg.numa_node);
  o->pin_memory = cfg.pin_memory;
  o->nvme_paths = cfg.nvme_paths;
  o->io_queue_depth = cfg.io.queue_depth;
  o->io_stripe_unit_bytes = cfg.io.block_bytes;
  o->io_direct = direct_mode(cfg);
  return ok_status();
}

Result<SessionOptions> session_options(const EngineConfig& cfg, std::vector<std::string>* warnings) {
  SessionOptions o;
  STRATA_RETURN_IF_ERROR(take_config(cfg, &o));
  o.weights = cfg.constraints.weights == Tier::kNvme ? Tier::kNvme : Tier::kHost;
  o.states = cfg.constraints.states == Tier::kNvme || o.weights == Tier::kNvme ? Tier::kNvme : Tier::kHost;
  if (o.states == Tier::kNvme && cfg.constraints.states && *cfg.constraints.states != Tier::kNvme) {
    return invalid_argument(
        "config: the weights on NVMe need the optimizer states there too, the config puts them on " +
        std::string(tier_name(*cfg.constraints.states)));
  }
  // Gradients on NVMe: a ring of host buffers, the rest beside the states.
  if (cfg.constraints.gradients == Tier::kNvme) {
    if (cfg.constraints.states && *cfg.constraints.states != Tier::kNvme) {
      return invalid_argument(
          "config key placement.gradients: gradients on NVMe need the optimizer states there "
          "too, the config puts them on " +
          std::string(tier_name(*cfg.constraints.states)));
    }
    o.gradients = o.states = Tier::kNvme;
  }
  if (o.states == Tier::kNvme && cfg.nvme_paths.empty()) {
    return invalid_argument("config key nvme_paths: the optimizer states on NVMe need a directory");
  }
  // Saved activations the model hands the session: host RAM, or NVMe.
  o.activations = cfg.constraints.activations == Tier::kNvme ? Tier::kNvme : Tier::kHost;
  if (o.activations == Tier::kNvme && cfg.nvme_paths.empty()) {
    return invalid_argument("config key nvme_paths: saved activations on NVMe need a directory");
  }
  o.device_bytes = cfg.budgets.device_bytes;
  o.host_budget_bytes = cfg.budgets.host_bytes;
  o.nvme_budget_bytes = cfg.nvme_budget_given ? cfg.budgets.nvme_bytes : 0;
  o.speculate_in_ram = cfg.speculate_in_ram && o.states == Tier::kHost;
  o.prefetch_depth = static_cast<int>(cfg.session.prefetch_depth);
  o.resident_first = cfg.session.resident_first;
  for (std::string& w : unhonoured(cfg)) {
    log_warning(w);
    if (warnings != nullptr) warnings->push_back(std::move(w));
  }
  return o;
}

Budgets budgets_or_defaults(Budgets b, bool* defaulted) {
  const bool fill = b.device_bytes == 0 || b.host_bytes == 0;
  if (b.device_bytes == 0) b.device_bytes = 1ull << 30;
  if (b.host_bytes == 0) b.host_bytes = physical_memory_bytes() / 2;
  if (defaulted != nullptr) *defaulted = fill;
  return b;
}

}  // namespace strata::engine
