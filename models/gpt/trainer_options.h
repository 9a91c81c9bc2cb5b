// The built-in GPT trainer's options (TrainerOptions) and what is known of
// a run before anything is built: the planner's view of it
// (training_setup, run_placement) and what Trainer::create refuses before
// it allocates (check_options, check_budgets), in trainer_options.cpp.
#pragma once

#include <cstdint>
#include <functional>

#include "common/status.h"
#include "engine/plan.h"
#include "engine/session.h"
#include "gpu/device_factory.h"
#include "models/gpt/gpt_config.h"

namespace strata::engine {

// One run of the built-in GPT: the session's options (where every view
// lives, the optimizer, precision, budgets, I/O, faults, trace, progress:
// engine/session.h, with the same meaning) and the GPT's own. The trainer
// hands the session its part whole, except where the GPT decides: its
// embeddings stay resident (resident_first), a resident run has a weight
// slot for every chunk (prefetch_depth applies when stream_weights), and
// block inputs kept on the device (activations kDevice) are never handed
// over. The placement rules are check_placement's (engine/plan.h).
//
// What the trainer reads differently from a bare session:
//   - device_bytes: the device's cap in every placement and on every
//     backend (0: none), checked against the planner's count before allocating.
//   - activations: where saved block inputs wait for backward — kDevice
//     (the default), or kHost / kNvme when the weights stream.
//   - weights: kHost, or kNvme beside the states on NVMe (needs stream_weights).
//   - the host and NVMe budgets are held before allocating, naming the
//     budget and the placement the planner would choose within them.
struct TrainerOptions : SessionOptions {
  using Backend = gpu::Backend;
  TrainerOptions() {
    activations = Tier::kDevice;
    resident_first = true;  // the embeddings, used at both ends of a step
  }
  gpt::GptConfig model;
  int64_t batch = 2;
  int64_t seq = 16;
  // With grad_accum > 1: the vertical order — every micro-batch of a block
  // runs while its weights are on the device, so the weights are fetched
  // once per step instead of once per micro-batch (streamed, and from NVMe,
  // bytes per token fall with grad_accum). Costs grad_accum sets of block
  // gradients and embedding gradients on the device, and of block inputs
  // on the tier `activations` names. The same bits as the default order,
  // one micro-batch after another.
  bool vertical_accumulation = false;
  // The vertical order in groups: this many micro-batches share a pass (a
  // divisor of grad_accum; later passes of a step keep what the last left
  // on the device); 0: all of them.
  int64_t vertical_group = 0;
  uint64_t seed = 1;
  // Stream each block's weights through a capped device (of device_bytes)
  // `prefetch_depth` chunks ahead, recomputing blocks in backward;
  // otherwise the weights stay resident.
  bool stream_weights = false;
  // false: create() leaves the weights and optimizer states unset — no
  // initial draws, and states on NVMe not written (a 10B model's 120 GB) —
  // for a load() to fill: a resume. Until a load() succeeds, step() and
  // save() are refused.
  bool initial_state = true;
  // Asked before each block of a step (SessionGptOptions::stop): true
  // cancels the step in progress, leaving the trainer as it was before it;
  // step() returns Cancelled.
  std::function<bool()> stop;
};

// The planner's view of a trainer's run: model, micro-batch, sequence,
// accumulation, the device computing in `precision`, the Adam states' type, the
// host backend's workspace, a delayed update's second gradient buffers.
TrainSetup training_setup(const TrainerOptions& options);
// The session's part of a trainer's run, as the trainer creates its
// session: the options whole, but a resident run's weight slots (one per
// chunk) and block inputs on the device (the GPT's own, none handed over).
SessionOptions session_options_of(const TrainerOptions& options);
// Micro-batches per pass of the streamed model: 1, or the vertical order's group.
int64_t micro_batches_per_pass(const TrainerOptions& options);
// The placement a trainer with these options runs, as the planner sees it
// (the inverse of apply_planned_placement): what estimate() takes for the run.
Placement run_placement(const TrainerOptions& options);

// Shapes, placements the trainer does not run, out-of-range knobs.
Status check_options(const TrainerOptions& o);
// Every budget against the planner's bytes for this run's placement.
Status check_budgets(const TrainerOptions& o);

}  // namespace strata::engine
