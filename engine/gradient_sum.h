// The fp32 sum of a chunk's micro-batch gradients (gradient accumulation),
// shared by the trainer and the session: both add the same way, so a
// model gets the same bits through either.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

#include "common/dtype.h"
#include "common/status.h"
#include "cpu_optim/executor.h"

namespace strata::engine {

// acc (fp32) = g (`first`) or acc + g, element by element, for the bf16,
// fp16 or fp32 gradient g of n elements, on the executor's threads (the
// same bits at any thread count: each element is one widening and at most
// one addition).
void add_gradient(float* acc, const void* g, DType dtype, size_t n, bool first, cpu_optim::Executor& ex);

// A task that waits for `ready` (the gradient's copy to the host; empty:
// none) and then runs add_gradient: what the accumulator's thread, or the
// optimizer stage taking a chunk's last micro-batch, runs as it lands.
std::function<Status()> add_gradient_when(std::function<Status()> ready, float* acc, const void* g, DType dtype,
                                          size_t n, bool first, cpu_optim::Executor& ex);

}  // namespace strata::engine
