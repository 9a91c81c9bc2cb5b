#include "engine/loss_scaler.h"

#include <algorithm>
#include <cmath>
#include <string>

namespace strata::engine {
namespace {
bool power_of_two(double x) {
  int e = 0;
  return x > 0 && std::frexp(x, &e) == 0.5;
}
}  // namespace

Result<LossScaler> LossScaler::create(const LossScaleOptions& o) {
  if (o.initial_power < 0 || o.initial_power > 100) {
    return invalid_argument("loss scale: initial_power must be 0..100, got " + std::to_string(o.initial_power));
  }
  if (o.window < 1) return invalid_argument("loss scale: window must be >= 1, got " + std::to_string(o.window));
  if (o.hysteresis < 1) {
    return invalid_argument("loss scale: hysteresis must be >= 1, got " + std::to_string(o.hysteresis));
  }
  if (!power_of_two(o.min_scale) || o.min_scale > std::ldexp(1.0, o.initial_power)) {
    return invalid_argument("loss scale: min_scale must be a power of two no larger than the initial scale, got " +
                            std::to_string(o.min_scale));
  }
  LossScaler s;
  s.o_ = o;
  s.scale_ = std::ldexp(1.0, o.initial_power);
  s.hysteresis_left_ = o.hysteresis;
  return s;
}

void LossScaler::update(bool overflow) {
  if (overflow) {
    good_steps_ = 0;
    if (hysteresis_left_ > 1) {
      --hysteresis_left_;
    } else {
      scale_ = std::max(scale_ / 2, o_.min_scale);
    }
    return;
  }
  if (++good_steps_ >= o_.window) {
    // 2^127 is the largest power of two a float holds.
    scale_ = std::min(scale_ * 2, std::ldexp(1.0, 127));
    good_steps_ = 0;
    hysteresis_left_ = o_.hysteresis;
  }
}

Status LossScaler::set_scale(double scale) {
  if (!power_of_two(scale) || scale < o_.min_scale || scale > std::ldexp(1.0, 127)) {
    return invalid_argument("loss scale: " + std::to_string(scale) + " is not a power of two in [min_scale " +
                            std::to_string(o_.min_scale) + ", 2^127] (powers of two keep the scaling exact)");
  }
  scale_ = scale;
  good_steps_ = 0;
  hysteresis_left_ = o_.hysteresis;
  return ok_status();
}

Status LossScaler::restore(const State& s) {
  if (!power_of_two(s.scale) || s.scale < o_.min_scale || s.scale > std::ldexp(1.0, 127) || s.good_steps < 0 ||
      s.hysteresis_left < 1 || s.hysteresis_left > o_.hysteresis) {
    return invalid_argument("loss scale: the saved state (scale " + std::to_string(s.scale) + ", good steps " +
                            std::to_string(s.good_steps) + ", hysteresis left " + std::to_string(s.hysteresis_left) +
                            ") does not fit these options");
  }
  scale_ = s.scale;
  good_steps_ = s.good_steps;
  hysteresis_left_ = s.hysteresis_left;
  return ok_status();
}

}  // namespace strata::engine
