// The built-in GPT's measured compute rate on a device, for a planner's
// time prediction: what one transformer block sustains through the GPT's
// ops (forward, then the backward's recompute and backward: the training
// pass the streamed model runs). It takes a fraction of a second.
#pragma once

#include <cstdint>

#include "common/dtype.h"
#include "common/status.h"
#include "gpu/device.h"
#include "models/gpt/gpt_config.h"

namespace strata::gpt {

// The model FLOPs per second (gpt_config.h's count, attention included,
// LayerNorm/GELU/softmax not: their time is in the rate) that `device`
// sustains on one block of `config` in `dtype` over batch x seq tokens,
// timed over repetitions until min_seconds have passed (after a warm-up),
// cycling through copies of the block's weights (768 MiB of them, at most
// 8) as training cycles through its blocks: a wide block is read from
// memory, not the caches. Takes workspace, those copies and a gradient
// from the device: ResourceExhausted when its budget cannot hold them.
Result<double> measure_block_flops(gpu::Device& device, const GptConfig& config, DType dtype, int64_t batch, int64_t seq,
                                   double min_seconds);

}  // namespace strata::gpt
