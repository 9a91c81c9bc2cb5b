// What Trainer::create checks before it allocates anything, apart from
// trainer.cpp (trainer_options.cpp): each returns the first problem,
// naming the option and what is allowed.
#pragma once

#include "common/status.h"
#include "cpu_optim/executor.h"
#include "models/gpt/trainer.h"

namespace strata::engine {

// Shapes, placements the trainer does not run, out-of-range knobs.
Status check_options(const TrainerOptions& o);
// The rest: the schedule, NUMA, NVMe directories, staging.
Status check_resources(const TrainerOptions& o);
// Every budget against the planner's bytes for this run's placement.
Status check_budgets(const TrainerOptions& o);
// The optimizer's threads: beside the host backend's compute threads, on
// the NUMA node asked for or the GPU's.
cpu_optim::ExecutorOptions executor_options(const TrainerOptions& o);

}  // namespace strata::engine
