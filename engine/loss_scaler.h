// Dynamic loss scaling for fp16 training, with DeepSpeed's rules: the loss
// (so every gradient) is multiplied by a power of two; a step whose
// gradients overflow is skipped, and after `hysteresis` overflows in a row
// the scale halves (never below min_scale); after `window` steps without an
// overflow it doubles. Powers of two keep the scaling itself exact.
#pragma once

#include <cstdint>

#include "common/status.h"

namespace strata::engine {

struct LossScaleOptions {
  int initial_power = 16;  // the scale starts at 2^initial_power
  int window = 1000;       // overflow-free steps before the scale doubles
  int hysteresis = 2;      // overflows in a row before the scale halves
  double min_scale = 1.0;
};

class LossScaler {
 public:
  static Result<LossScaler> create(const LossScaleOptions& o);
  LossScaler() = default;

  double scale() const { return scale_; }
  // After each step: `overflow` says whether it was skipped for inf/nan.
  void update(bool overflow);
  // The caller's scale from now on: a power of two in [min_scale, 2^127];
  // the dynamic rules go on from it (a fresh window and hysteresis).
  // InvalidArgument otherwise, changing nothing.
  Status set_scale(double scale);

  // The whole state, for checkpoints.
  struct State {
    double scale = 1;
    int64_t good_steps = 0;
    int hysteresis_left = 1;
  };
  State state() const { return {scale_, good_steps_, hysteresis_left_}; }
  Status restore(const State& s);

 private:
  LossScaleOptions o_;
  double scale_ = 1;
  int64_t good_steps_ = 0;
  int hysteresis_left_ = 1;
};

}  // namespace strata::engine
