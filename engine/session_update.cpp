// Session's updates: what a finished one moves (the verdict, the loss
// scale, the counts) and the delayed update (session.h), whose update of
// step t is begun at end_step and runs beside the model's step t+1. The
// exact schedule's begin and end are in session.cpp.
#include <string>
#include <utility>

#include "engine/session.h"

namespace strata::engine {

Status Session::set_loss_scale(double scale) {
  STRATA_RETURN_IF_ERROR(usable("set_loss_scale"));
  if (in_step_) {
    return failed_precondition(
        "session: set_loss_scale inside a step: its gradients are scaled by the scale it "
        "began with (end_step or cancel_step first)");
  }
  if (options_.precision != DType::kF16) {
    if (scale == 1) return ok_status();
    return invalid_argument("session: set_loss_scale: a " + std::string(dtype_name(options_.precision)) +
                            " session does not scale its loss (precision fp16 does); only 1 is its scale");
  }
  return scaler_.set_scale(scale).with_context("session: set_loss_scale");
}

StepVerdict Session::take(const OverlapOutcome& outcome, double lr) {
  last_clipped_ = outcome.clipped;
  last_skipped_ = outcome.skipped;
  if (options_.precision == DType::kF16) scaler_.update(outcome.skipped);
  if (!outcome.skipped) ++updates_;
  StepVerdict v;
  v.grad_norm = outcome.grad_norm;
  v.clipped = outcome.clipped;
  v.skipped = outcome.skipped;
  v.rolled_back = outcome.rolled_back;
  v.lr = lr;
  v.loss_scale = loss_scale();
  v.update = outcome.counters;
  return v;
}

// Every gradient of the step is on the host (the copies landed, the sums
// made): the last step's update lands and this step's begins, reading the
// set the model just filled; the model's next step fills the other.
Result<StepVerdict> Session::end_delayed_step() {
  Status ready = accumulator_ ? accumulator_->drain() : ok_status();
  for (size_t c = 0; ready.ok() && c < specs_.size(); ++c) ready = store_->await_gradient(c);
  store_->end_step();
  in_step_ = false;
  if (!ready.ok()) {
    store_->drain();
    return ready.with_context("session: end_step: the step's gradients");  // the step is over, nothing of it kept
  }
  StepVerdict v;
  // A failure leaves the update marked failed, begun again by the next
  // begin_step; this step's gradients are dropped with it.
  STRATA_RETURN_IF_ERROR(drain_update(&v));
  landing_order_ = landed_now_;
  begin_update(make_step(grad_scale_));
  in_flight_lr_ = made_lr_;
  in_flight_step_ = ++steps_;
  if (options_.grad_accum > 1) {
    std::swap(sums_, sums_alt_);
  } else {
    std::swap(grads_, grads_alt_);
  }
  v.loss_scale = loss_scale();
  return v;
}

// Lands the update in flight, if any: its verdict into *verdict, the
// weights it wrote (beside those in use, in RAM) in their place unless it
// was skipped. A failed one is not taken — its states' new generation is
// never switched to, the weights it wrote beside are not swapped in — and
// is begun again, from the same gradients, by the next call here or
// begin_step.
Status Session::drain_update(StepVerdict* verdict) {
  restart_failed_update();
  if (!pending_.load()) return ok_status();
  pending_.store(false);
  Result<OverlapOutcome> outcome = stage_->finish();
  if (!outcome) {
    update_failed_.store(true);
    return std::move(outcome).error().with_context("session: the delayed update of step " +
                                                   std::to_string(in_flight_step_));
  }
  StepVerdict v = take(*outcome, in_flight_lr_);
  v.step = in_flight_step_;
  if (!outcome->skipped) std::swap(weights_, weights_next_);
  if (verdict != nullptr) *verdict = v;
  return ok_status();
}

void Session::restart_failed_update() {
  if (!update_failed_.load()) return;
  update_failed_.store(false);
  begin_update(in_flight_);
}

// Begins an update whose gradients are all on the host already.
void Session::begin_update(OverlapStep step) {
  in_flight_ = step;
  Status begun = stage_->begin(std::move(step));
  STRATA_CHECK_MSG(begun.ok(), "session: the optimizer stage refused a step: %s", begun.to_string().c_str());
  for (size_t c : in_flight_.order) stage_->land(c, {});
  pending_.store(true);
}

}  // namespace strata::engine
