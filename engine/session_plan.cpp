#include "engine/session_plan.h"

#include <utility>

namespace strata::engine {

Result<Plan> plan_session(const SessionOptions& options, std::shared_ptr<const PlanModel> model, int64_t micro_batch,
                          const Budgets& budgets, const Bandwidths& rates, const Constraints& fixed) {
  if (fixed.weights == Tier::kDevice) {
    return invalid_argument("a session keeps no weights on the device between uses: host or nvme");
  }
  TrainSetup setup = session_setup(options);
  for (DType t : model->chunk_dtypes()) STRATA_RETURN_IF_ERROR(check_chunk_dtype(t, options.precision));
  setup.model = std::move(model);
  setup.micro_batch = micro_batch;
  if (fixed.weights) return make_plan(setup, budgets, rates, fixed);
  // The weights streamed from the host or from NVMe, whichever is faster
  // within the budgets (the host on a tie).
  Constraints on = fixed;
  on.weights = Tier::kHost;
  Result<Plan> host = make_plan(setup, budgets, rates, on);
  if (budgets.nvme_bytes == 0) return host;
  on.weights = Tier::kNvme;
  Result<Plan> nvme = make_plan(setup, budgets, rates, on);
  if (!host) return nvme;
  if (nvme && nvme->step_seconds < host->step_seconds) return nvme;
  return host;
}

void apply_session_plan(const Plan& plan, SessionOptions* o) {
  const Placement& pl = plan.placement;
  o->weights = pl.weights;
  o->states = pl.states;
  o->gradients = pl.gradients;
  o->activations = pl.activations == Tier::kNvme ? Tier::kNvme : Tier::kHost;
  o->prefetch_depth = pl.prefetch_depth;
  o->speculate_in_ram = pl.speculate_in_ram;
}

}  // namespace strata::engine
