// The planner's rates for this machine, measured in about a second: the
// device's sustained FLOP rate on the run's model through its own ops, its
// host->device copy rate, and the CPU optimizer's parameters per second
// (AdamW over fp32 states, with the run's threads); with NVMe
// directories, their O_DIRECT write and read rates through the swap store
// (64 MiB each way, striped as the engine stripes).
// Without this the planner divides by a GPU server's defaults, which on the
// host backend predicts steps 10-40x too short.
#pragma once

#include <string>
#include <vector>

#include "common/status.h"
#include "engine/plan.h"
#include "gpu/device.h"

namespace strata::engine {

struct CalibrateOptions {
  double seconds_each = 0.15;  // timed repetitions per rate, after a warm-up
  int optimizer_threads = 0;   // 0: every core
  bool host_backend = true;    // the device is the host's cores (Bandwidths::shares_host_cores)
  std::vector<std::string> nvme_paths;  // empty: Bandwidths' NVMe figures are kept
};

// Measures `device` for `setup`'s model (its own measure of its compute at
// the run's micro-batch: PlanModel::measure_flops; the built-in GPT's is a
// block of its width) and the CPU optimizer over its parameters. The device
// needs room for what the model measures with.
Result<Bandwidths> measure_bandwidths(gpu::Device& device, const TrainSetup& setup, const CalibrateOptions& options);

}  // namespace strata::engine
