// The learning rate step by step: a warmup from `start_lr` to the peak (the
// optimizer's lr), then constant, or a linear or cosine decay to `end_lr`
// reached at step `decay_end_step`. The shapes of DeepSpeed's WarmupLR,
// WarmupDecayLR and WarmupCosineLR (and of the common warmup + cosine
// recipe), computed by the formula below; a function of the step alone, so
// a resumed run follows the same rates.
//
// With i = step - 1 (the updates before this one) and W = warmup_steps:
//   i < W:  start + (peak - start) * g,  g = i / W (linear) or
//           log(i + 1) / log(W) (log, W >= 2; DeepSpeed's default warmup)
//   i >= W: peak (constant);
//           end + (peak - end) * max(0, (T - i) / (T - W)) (linear);
//           end + (peak - end) * (1 + cos(pi * min(1, (i - W) / (T - W)))) / 2
//           (cosine), T = decay_end_step.
#pragma once

#include <cstdint>
#include <string_view>

#include "common/status.h"

namespace strata::engine {

struct LrSchedule {
  enum class Warmup { kLinear, kLog };
  enum class Decay { kConstant, kLinear, kCosine };
  int64_t warmup_steps = 0;  // 0: the peak from the first step
  Warmup warmup = Warmup::kLinear;
  double start_lr = 0.0;  // the first warmup step's rate
  Decay decay = Decay::kConstant;
  int64_t decay_end_step = 0;  // T: where a linear or cosine decay ends (> warmup_steps)
  double end_lr = 0.0;         // the rate from T on
};

// Rejects negative rates or steps and a decay that ends before the warmup does.
Status validate(const LrSchedule& s);
// The rate of optimizer step `step` (1 = the first) for peak rate `peak_lr`.
double lr_at(const LrSchedule& s, double peak_lr, int64_t step);

std::string_view decay_name(LrSchedule::Decay d);

}  // namespace strata::engine
