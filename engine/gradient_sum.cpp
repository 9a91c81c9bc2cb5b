#include "engine/gradient_sum.h"

namespace strata::engine {

void add_gradient(float* acc, const void* g, DType dtype, size_t n, bool first, cpu_optim::Executor& ex) {
  const auto* g16 = static_cast<const uint16_t*>(g);
  const auto* g32 = static_cast<const float*>(g);
  ex.parallel_for(static_cast<int64_t>(n), int64_t{1} << 16, [=](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const float x =
          dtype == DType::kF32 ? g32[i] : (dtype == DType::kBF16 ? bf16_to_f32(g16[i]) : f16_to_f32(g16[i]));
      acc[i] = first ? x : acc[i] + x;
    }
  });
}

std::function<Status()> add_gradient_when(std::function<Status()> ready, float* acc, const void* g, DType dtype,
                                          size_t n, bool first, cpu_optim::Executor& ex) {
  return [ready = std::move(ready), acc, g, dtype, n, first, ex = &ex]() -> Status {
    if (ready) STRATA_RETURN_IF_ERROR(ready());
    add_gradient(acc, g, dtype, n, first, *ex);
    return ok_status();
  };
}

}  // namespace strata::engine
