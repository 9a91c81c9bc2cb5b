#include "engine/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <string>

namespace strata::engine {

Status validate(const LrSchedule& s) {
  if (s.warmup_steps < 0) return invalid_argument("lr schedule: warmup_steps must be >= 0");
  if (!(s.start_lr >= 0) || !std::isfinite(s.start_lr) || !(s.end_lr >= 0) || !std::isfinite(s.end_lr)) {
    return invalid_argument("lr schedule: the start and end rates must be finite and >= 0");
  }
  if (s.decay != LrSchedule::Decay::kConstant && s.decay_end_step <= s.warmup_steps) {
    return invalid_argument("lr schedule: a " + std::string(decay_name(s.decay)) + " decay must end (step " +
                            std::to_string(s.decay_end_step) + ") after the warmup (" +
                            std::to_string(s.warmup_steps) + " steps)");
  }
  return ok_status();
}

double lr_at(const LrSchedule& s, double peak_lr, int64_t step) {
  const double i = static_cast<double>(std::max<int64_t>(step - 1, 0));
  const double w = static_cast<double>(s.warmup_steps);
  if (i < w) {
    const double g = s.warmup == LrSchedule::Warmup::kLog && s.warmup_steps >= 2 ? std::log(i + 1) / std::log(w) : i / w;
    return s.start_lr + (peak_lr - s.start_lr) * g;
  }
  const double span = static_cast<double>(s.decay_end_step) - w;
  switch (s.decay) {
    case LrSchedule::Decay::kConstant: return peak_lr;
    case LrSchedule::Decay::kLinear:
      return s.end_lr + (peak_lr - s.end_lr) * std::max(0.0, (static_cast<double>(s.decay_end_step) - i) / span);
    case LrSchedule::Decay::kCosine:
      return s.end_lr +
             (peak_lr - s.end_lr) * (1 + std::cos(std::numbers::pi * std::min(1.0, (i - w) / span))) / 2;
  }
  return peak_lr;
}

std::string_view decay_name(LrSchedule::Decay d) {
  switch (d) {
    case LrSchedule::Decay::kConstant: return "constant";
    case LrSchedule::Decay::kLinear: return "linear";
    case LrSchedule::Decay::kCosine: return "cosine";
  }
  return "?";
}

}  // namespace strata::engine
