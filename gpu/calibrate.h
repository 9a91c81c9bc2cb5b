// Measured rates of a device, for a planner's time prediction: what its
// host<->device copies move (a model measures its own compute: the
// built-in GPT does, through its ops). It takes a fraction of a
// second; the planner's defaults are a GPU server's, so a host-backend run
// without it predicts a GPU's copies.
#pragma once

#include <cstdint>

#include "common/status.h"
#include "gpu/device.h"

namespace strata::gpu {

// The host->device copy rate in bytes per second for copies of `bytes`
// (ordinary host memory; the engine's staging buffers are of that kind on
// the host backend), timed until min_seconds have passed.
Result<double> measure_copy_rate(Device& device, uint64_t bytes, double min_seconds);

}  // namespace strata::gpu
