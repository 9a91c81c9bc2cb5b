// AccessSchedule: the order in which a step uses the model's chunks,
// recorded on the first step and replayed afterwards, so the scheduler can
// fetch exactly k uses ahead. A use that differs from the recording (the
// model's order changed) is not an error: the schedule forgets what it
// predicted from that point on, and the step is recorded anew — a
// misprediction costs waiting, never a wrong chunk.
#pragma once

#include <cstddef>
#include <vector>

namespace strata::engine {

class AccessSchedule {
 public:
  // A new step starts at position 0.
  void begin_step() {
    pos_ = 0;
    recording_.clear();
  }

  // Notes that `chunk` is used next; returns the use's position in the step
  // and whether it was predicted (false while recording, or on a deviation,
  // after which nothing further is predicted this step).
  struct Use {
    size_t position;
    bool predicted;
  };
  Use use(size_t chunk) {
    const size_t p = pos_++;
    bool predicted = false;
    if (!order_.empty()) {
      predicted = p < order_.size() && order_[p] == chunk;
      if (!predicted) {
        // The recording is wrong from here: keep the uses seen this step
        // and record the rest.
        recording_.assign(order_.begin(), order_.begin() + static_cast<std::ptrdiff_t>(std::min(p, order_.size())));
        order_.clear();
        ++deviations_;
      }
    }
    if (order_.empty()) recording_.push_back(chunk);
    return {p, predicted};
  }

  // The chunk predicted at position p (valid when known(p)).
  bool known(size_t p) const { return p < order_.size(); }
  size_t chunk_at(size_t p) const { return order_[p]; }

  // A step that recorded becomes the order later steps replay.
  void end_step() {
    if (order_.empty() && !recording_.empty()) order_ = recording_;
    recording_.clear();
  }

  bool replaying() const { return !order_.empty(); }
  const std::vector<size_t>& order() const { return order_; }
  size_t deviations() const { return deviations_; }
  // Test hook: replay `order` from the next step on, as if recorded.
  void set_order(std::vector<size_t> order) { order_ = std::move(order); }

 private:
  std::vector<size_t> order_;      // the recorded order being replayed (empty: recording)
  std::vector<size_t> recording_;  // this step's uses while recording
  size_t pos_ = 0;
  size_t deviations_ = 0;
};

}  // namespace strata::engine
