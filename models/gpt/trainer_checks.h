// What Trainer::create checks before it allocates anything, apart from
// trainer.cpp (trainer_options.cpp): each returns the first problem,
// naming the option and what is allowed.
#pragma once

#include "common/status.h"
#include "models/gpt/trainer.h"

namespace strata::engine {

// Shapes, placements the trainer does not run, out-of-range knobs.
Status check_options(const TrainerOptions& o);
// Every budget against the planner's bytes for this run's placement.
Status check_budgets(const TrainerOptions& o);

}  // namespace strata::engine
