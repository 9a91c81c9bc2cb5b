// From a parsed config (parse_gpt_config) to what Trainer::create takes: the options the
// config gives by itself, the host backend's default budgets, and the
// planner's placement. strata-train starts from these before its flags; the
// C API (bindings/) uses them whole.
#pragma once

#include <string>
#include <vector>

#include "engine/config.h"
#include "engine/plan.h"
#include "engine/session_config.h"
#include "models/gpt/gpt_config_keys.h"
#include "models/gpt/trainer.h"

namespace strata::engine {

// What every run takes from the config (take_config: the optimizer and
// its schedule, precision, accumulation, states, I/O...) and the GPT's
// own: model, batch, sequence, seed, the vertical order. The states and
// gradients go on NVMe where the config fixes them there; everything
// else stays resident until a placement is applied. InvalidArgument naming
// the key for what the trainer cannot run. The config's "session" keys are
// a warning on stderr and in `warnings` (optional): the trainer plans its
// own prefetch.
Result<TrainerOptions> trainer_options(const GptRunConfig& config, std::vector<std::string>* warnings = nullptr);

// The budgets a run is held to, from its placement (set first): the
// device's cap when the weights stream or the device is a GPU, the host's,
// and the NVMe budget when anything lives on NVMe.
void apply_budgets(TrainerOptions* options, const Budgets& budgets);

// Applies the planner's placement — the fastest that fits `budgets` within
// `fixed` — to `options`: where the weights, states and saved activations live,
// whether the weights stream (and then the device cap), the prefetch depth,
// speculation in RAM, the vertical order of accumulation, and the NVMe paths (kept only where the plan puts
// something on NVMe). NVMe is a tier only when `nvme_paths` is not empty;
// with no NVMe budget it is their free space (nvme_free_bytes). Returns the
// plan, or the planner's error naming what does not fit. A choice in
// `options` the plan overrides (speculate_in_ram asked for and not
// planned) is a warning on stderr and in `warnings` (optional). `rates`:
// the links' speeds the plan is timed by (engine/calibrate.h measures them).
Result<Plan> apply_planned_placement(TrainerOptions* options, Budgets budgets, const Constraints& fixed,
                                     const std::vector<std::string>& nvme_paths,
                                     std::vector<std::string>* warnings = nullptr, const Bandwidths& rates = {});

}  // namespace strata::engine
