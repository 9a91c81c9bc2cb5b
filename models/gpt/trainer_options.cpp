// The trainer's options before anything is built: the planner's view of a
// run (training_setup, run_placement) and what Trainer::create refuses
// before it allocates (trainer_checks.h).
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "common/units.h"
#include "engine/session.h"
#include "gpu/device_factory.h"
#include "gpu/device_info.h"
#include "models/gpt/trainer.h"
#include "models/gpt/trainer_checks.h"

namespace strata::engine {

TrainSetup training_setup(const TrainerOptions& o) {
  TrainSetup s;
  s.model = o.model;
  s.micro_batch = o.batch;
  s.seq = o.seq;
  s.grad_accum = o.grad_accum;
  s.compute = o.precision;
  s.working = o.precision;
  s.state_bytes_per_param = cpu_optim::adam_state_bytes_per_param(o.adam_states);
  s.state_piece_elems = o.state_piece_elems;
  s.gradient_buffers = o.gradient_buffers;
  s.host_backend = o.backend == TrainerOptions::Backend::kHost;
  s.delayed_update = o.delayed_update;
  s.micro_batches_per_pass = micro_batches_per_pass(o);
  return s;
}

int64_t micro_batches_per_pass(const TrainerOptions& o) {
  if (!o.vertical_accumulation || o.grad_accum <= 1) return 1;
  return o.vertical_group > 0 ? o.vertical_group : o.grad_accum;
}

Placement run_placement(const TrainerOptions& o) {
  Placement pl;
  pl.weights = o.stream_weights ? o.weights : Tier::kDevice;
  pl.states = o.states;
  pl.checkpoints = o.activation_checkpoints;
  pl.prefetch_depth = o.stream_weights ? o.prefetch_depth : 1;
  pl.speculate_in_ram = o.speculate_in_ram;
  pl.micro_batches_per_pass = micro_batches_per_pass(o);
  pl.gradients = o.gradients;
  return pl;
}

// What create() refuses before it allocates anything: shapes, placements
// the trainer does not run, and out-of-range knobs.
Status check_options(const TrainerOptions& o) {
  STRATA_RETURN_IF_ERROR(o.model.validate());
  // Here, not at the first step: by then the run has allocated and
  // initialised everything.
  STRATA_RETURN_IF_ERROR(cpu_optim::validate(o.adam).with_context("trainer"));
  if (o.batch < 1 || o.seq < 1 || o.seq > o.model.max_seq) {
    return invalid_argument("trainer: batch >= 1 and 1 <= seq <= max_seq required");
  }
  if (o.grad_accum < 1 || o.grad_accum > 4096) {
    return invalid_argument("trainer: grad_accum must be 1..4096, got " + std::to_string(o.grad_accum));
  }
  if (o.weights != Tier::kHost && o.weights != Tier::kNvme) {
    return invalid_argument("trainer: the weights live on the host or on NVMe");
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
  if (o.gradient_buffers < 1 || o.gradient_buffers > 64) {
    return invalid_argument("trainer: gradient_buffers must be 1..64, got " + std::to_string(o.gradient_buffers));
  }
  if (o.precision != DType::kBF16 && o.precision != DType::kF16 && o.precision != DType::kF32) {
    return invalid_argument("trainer: precision must be bf16, fp16 or fp32");
  }
  if (!(o.clip_norm >= 0) || !std::isfinite(o.clip_norm)) {
    return invalid_argument("trainer: clip_norm must be finite and >= 0 (0 = off), got " + std::to_string(o.clip_norm));
  }
  if (o.compute_threads < 0 || o.compute_threads > 4096) {
    return invalid_argument("trainer: compute_threads must be 0..4096, got " + std::to_string(o.compute_threads));
  }
  if (o.backend == TrainerOptions::Backend::kCuda && !gpu::backend_built(gpu::Backend::kCuda)) {
    return unimplemented(
        "trainer: this build has no CUDA (the cuda backend needs nvcc at build time); run on the host backend "
        "(device \"host\")");
  }
  return ok_status();
}

// The rest of them: steps, threads, NUMA, NVMe and staging.
Status check_resources(const TrainerOptions& o) {
  STRATA_RETURN_IF_ERROR(validate(o.lr_schedule).with_context("trainer"));
  if (o.numa_node < -1) {
    return invalid_argument("trainer: numa_node must be -1 (auto) or a node number, got " +
                            std::to_string(o.numa_node));
  }
  STRATA_RETURN_IF_ERROR(check_state_piece_elems(o.state_piece_elems).with_context("trainer"));
  if (o.states == Tier::kNvme || o.activation_checkpoints == Tier::kNvme) {
    if (o.nvme_paths.empty())
      return invalid_argument("trainer: optimizer states or checkpoints on NVMe need nvme_paths");
  }
  if (o.staging_buffers < 3 || o.staging_buffers > 64) {
    return invalid_argument("trainer: staging_buffers must be 3..64, got " + std::to_string(o.staging_buffers));
  }
  return ok_status();
}

// The optimizer's threads: on the host backend with its compute capped at
// compute_threads cores, the others (as beside a GPU), instead of
// time-slicing the compute thread's core; on the NUMA node asked for, or
// (CUDA) the GPU's.
cpu_optim::ExecutorOptions executor_options(const TrainerOptions& o) {
  return executor_options(o.backend == TrainerOptions::Backend::kCuda ? gpu::Backend::kCuda : gpu::Backend::kHost,
                          o.compute_threads, o.numa_node);
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
