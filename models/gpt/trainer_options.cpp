// The trainer's options before anything is built: the planner's view of a
// run (training_setup, run_placement) and what Trainer::create refuses
// before it allocates (trainer_options.h).
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "common/units.h"
#include "engine/session.h"
#include "gpu/device_factory.h"
#include "gpu/device_info.h"
#include "models/gpt/gpt_plan_model.h"
#include "models/gpt/trainer_options.h"

namespace strata::engine {

TrainSetup training_setup(const TrainerOptions& o) {
  TrainSetup s = session_setup(o);
  s.model = gpt_plan_model(o.model, o.seq);
  s.micro_batch = o.batch;
  s.micro_batches_per_pass = micro_batches_per_pass(o);
  return s;
}

int64_t micro_batches_per_pass(const TrainerOptions& o) {
  if (!o.vertical_accumulation || o.grad_accum <= 1) return 1;
  return o.vertical_group > 0 ? o.vertical_group : o.grad_accum;
}

// The session's placement, but resident weights (and their one "prefetch")
// when they do not stream, and the vertical order's pass.
Placement run_placement(const TrainerOptions& o) {
  Placement pl = session_placement(o);
  pl.weights = o.stream_weights ? o.weights : Tier::kDevice;
  pl.prefetch_depth = o.stream_weights ? o.prefetch_depth : 1;
  pl.micro_batches_per_pass = micro_batches_per_pass(o);
  return pl;
}

SessionOptions session_options_of(const TrainerOptions& o) {
  SessionOptions s = o;
  // Resident: a weight slot for every chunk the embeddings leave (the
  // blocks and the final norm), each copied up once a step and kept.
  if (!o.stream_weights) s.prefetch_depth = static_cast<int>(o.model.layers);
  // Block inputs on the device are the GPT's own, never handed over.
  if (o.activations == Tier::kDevice) s.activations = Tier::kHost;
  return s;
}

// What create() refuses before it allocates anything: the GPT's shapes,
// the placement rules for the GPT's placement (resident weights and
// activations on the device included), then the session's own checks of
// its part.
Status check_options(const TrainerOptions& o) {
  STRATA_RETURN_IF_ERROR(o.model.validate());
  if (o.batch < 1 || o.seq < 1 || o.seq > o.model.max_seq) {
    return invalid_argument("trainer: batch >= 1 and 1 <= seq <= max_seq required");
  }
  if (o.weights == Tier::kNvme && !o.stream_weights) {
    return invalid_argument("trainer: weights on NVMe need stream_weights");
  }
  // Named here by the option: check_placement only sees its pass size.
  if (o.vertical_accumulation && o.grad_accum > 1 &&
      (o.vertical_group < 0 || (o.vertical_group > 0 && o.grad_accum % o.vertical_group != 0))) {
    return invalid_argument("trainer: vertical_group must divide grad_accum (" + std::to_string(o.grad_accum) +
                            "), or be 0 for all of them; got " + std::to_string(o.vertical_group));
  }
  STRATA_RETURN_IF_ERROR(check_placement(training_setup(o), run_placement(o)).with_context("trainer"));
  // Here, not at the first step: by then the run has allocated and
  // initialised everything.
  return check_session_options(session_options_of(o)).with_context("trainer");
}

// Every budget against the planner's bytes for this run's placement,
// before anything is allocated or initialised: a host budget far below the
// run's need was refused only after the process had grown to the need (an
// out-of-memory kill waiting to happen on a smaller machine). The planner
// counts what the trainer allocates (a test holds the two within 1% on the
// host, 5% on the device); the check after allocating stays as the exact one.
// The refusal names the budget, the need and the placement the planner
// would choose within the same budgets, or what it says does not fit.
Status check_budgets(const TrainerOptions& o) {
  const TrainSetup setup = training_setup(o);
  const Plan need = estimate(setup, run_placement(o), Bandwidths{});
  std::string over;
  auto check = [&](const char* key, uint64_t needed, uint64_t budget) {
    if (budget == 0 || needed <= budget) return;
    over += std::string(over.empty() ? "" : "; ") + key + " is " + format_bytes(budget) + ", this placement (" +
            placement_text(run_placement(o)) + ") needs " + format_bytes(needed);
  };
  check("budgets.device", need.device.total(), o.device_bytes);
  check("budgets.host", need.host.total(), o.host_budget_bytes);
  check("budgets.nvme", need.nvme.total(), o.nvme_budget_bytes);
  if (over.empty()) return ok_status();
  Budgets within;
  within.device_bytes = o.device_bytes > 0 ? o.device_bytes : std::numeric_limits<uint64_t>::max() / 4;
  within.host_bytes = o.host_budget_bytes > 0 ? o.host_budget_bytes : std::numeric_limits<uint64_t>::max() / 4;
  within.nvme_bytes = o.nvme_paths.empty() ? 0 : o.nvme_budget_bytes;
  Result<Plan> nearest = make_plan(setup, within, Bandwidths{});
  const std::string way = nearest ? "the planner's placement within these budgets: " +
                                        placement_text(nearest->placement) + " (strata-train --auto-placement)"
                                  : std::string(nearest.error().message());
  return resource_exhausted("trainer: refused before allocating: " + over + "; " + way);
}

}  // namespace strata::engine
