#include "models/gpt/trainer_config.h"

#include "common/log.h"
#include "common/units.h"
#include "io/device_factory.h"

namespace strata::engine {

Result<TrainerOptions> trainer_options(const GptRunConfig& run, std::vector<std::string>* warnings) {
  const EngineConfig& cfg = run.engine;
  if (cfg.session.given) {
    const std::string w =
        "config key session: the built-in GPT's trainer plans its own prefetch and keeps its embeddings resident; "
        "ignored";
    log_warning(w);
    if (warnings != nullptr) warnings->push_back(w);
  }
  TrainerOptions o;
  STRATA_RETURN_IF_ERROR(take_config(cfg, &o));
  o.model = run.gpt.model;
  o.batch = cfg.setup.micro_batch;
  o.seq = run.gpt.seq;
  o.vertical_accumulation = cfg.vertical_accumulation;
  o.seed = cfg.seed;
  // Where the views live is the planner's (apply_planned_placement), but
  // for what the config fixes on NVMe.
  if (cfg.constraints.states == Tier::kNvme) o.states = Tier::kNvme;
  if (cfg.constraints.gradients == Tier::kNvme) o.gradients = Tier::kNvme;
  o.speculate_in_ram = cfg.speculate_in_ram && o.states == Tier::kHost;
  return o;
}

Result<Plan> apply_planned_placement(TrainerOptions* o, Budgets budgets, const Constraints& fixed,
                                     const std::vector<std::string>& nvme_paths, std::vector<std::string>* warnings,
                                     const Bandwidths& rates) {
  const bool speculation_asked = o->speculate_in_ram;
  if (nvme_paths.empty()) {
    budgets.nvme_bytes = 0;
  } else if (budgets.nvme_bytes == 0) {
    STRATA_ASSIGN_OR_RETURN(budgets.nvme_bytes, nvme_free_bytes(nvme_paths));
  }
  STRATA_ASSIGN_OR_RETURN(Plan plan, make_plan(training_setup(*o), budgets, rates, fixed));
  const Placement& pl = plan.placement;
  o->stream_weights = pl.weights != Tier::kDevice;
  o->weights = pl.weights == Tier::kNvme ? Tier::kNvme : Tier::kHost;
  o->states = pl.states;
  o->activations = pl.activations;
  o->prefetch_depth = o->stream_weights ? pl.prefetch_depth : 1;
  o->speculate_in_ram = pl.speculate_in_ram;
  if (speculation_asked && !pl.speculate_in_ram) {
    // Asked for and not planned: said, never dropped silently.
    const std::string why =
        pl.states == Tier::kNvme
            ? "the planner keeps the optimizer states on NVMe, where speculative updates keep their old "
              "generation anyway"
            : "the planner found no faster placement within the budgets with a second copy of the states in RAM "
              "(12 bytes per parameter more on the host)";
    const std::string text = "config key speculate_in_ram: true is not honoured: " + why;
    log_warning(text);
    if (warnings != nullptr) warnings->push_back(text);
  }
  o->gradients = pl.gradients;
  o->vertical_accumulation = pl.micro_batches_per_pass > 1;
  o->vertical_group = pl.micro_batches_per_pass > 1 ? pl.micro_batches_per_pass : 0;
  const bool on_nvme = pl.weights == Tier::kNvme || pl.states == Tier::kNvme || pl.activations == Tier::kNvme;
  o->nvme_paths = on_nvme ? nvme_paths : std::vector<std::string>{};
  apply_budgets(o, budgets);
  return plan;
}

void apply_budgets(TrainerOptions* o, const Budgets& budgets) {
  const bool on_nvme = o->weights == Tier::kNvme || o->states == Tier::kNvme || o->activations == Tier::kNvme;
  o->device_bytes = budgets.device_bytes;  // held on every backend and placement
  o->host_budget_bytes = budgets.host_bytes;
  o->nvme_budget_bytes = on_nvme ? budgets.nvme_bytes : 0;
}

}  // namespace strata::engine
