// Planning a session: the fastest placement a session can run a model of
// the caller's with within budgets, from what the model says of itself
// (plan_model.h). A session streams its weights from the host or NVMe
// through its slots (it keeps none on the device between uses), and with
// the saved activations "on the device" the model keeps them itself.
#pragma once

#include <memory>

#include "engine/plan.h"
#include "engine/plan_model.h"
#include "engine/session.h"

namespace strata::engine {

// The plan for `model`'s micro-batches of `micro_batch` on a session of
// `options` (its precision, accumulation, states' type, backend...; its
// tiers are the plan's to choose, but for those `fixed`). What make_plan
// returns and refuses; InvalidArgument for weights fixed on the device.
Result<Plan> plan_session(const SessionOptions& options, std::shared_ptr<const PlanModel> model, int64_t micro_batch,
                          const Budgets& budgets, const Bandwidths& rates = {}, const Constraints& fixed = {});

// The plan's placement on `options`: the tiers, the prefetch depth, a
// second copy of the states in RAM. The saved activations' tier is where the
// model hands them (the host when the plan keeps them on the device).
void apply_session_plan(const Plan& plan, SessionOptions* options);

}  // namespace strata::engine
