// Measured rates of a device, for a planner's time prediction: what one
// transformer block of the built-in GPT sustains through the device's own
// model ops (forward, then the backward's recompute and backward: the
// training pass the streamed model runs), and what its host<->device copies
// move. Each takes a fraction of a second; the planner's defaults are a
// GPU server's, so a host-backend run without these predicts a GPU's step.
#pragma once

#include <cstdint>

#include "common/dtype.h"
#include "common/status.h"
#include "gpu/device.h"
#include "gpu/gpt_config.h"

namespace strata::gpu {

// The model FLOPs per second (gpt_config.h's count, attention included,
// LayerNorm/GELU/softmax not: their time is in the rate) that `device`
// sustains on one block of `config` in `dtype` over batch x seq tokens,
// timed over repetitions until min_seconds have passed (after a warm-up),
// cycling through copies of the block's weights (768 MiB of them, at most
// 8) as training cycles through its blocks: a wide block is read from
// memory, not the caches. Takes workspace, those copies and a gradient
// from the device: ResourceExhausted when its budget cannot hold them.
Result<double> measure_block_flops(Device& device, const GptConfig& config, DType dtype, int64_t batch, int64_t seq,
                                   double min_seconds);

// The host->device copy rate in bytes per second for copies of `bytes`
// (ordinary host memory; the engine's staging buffers are of that kind on
// the host backend), timed until min_seconds have passed.
Result<double> measure_copy_rate(Device& device, uint64_t bytes, double min_seconds);

}  // namespace strata::gpu
