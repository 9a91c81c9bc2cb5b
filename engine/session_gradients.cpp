// Session's gradients: the device buffers handed to the model, the copies
// back to the host, their fp32 sums over the micro-batches, the gradient
// order, and with the gradients on NVMe the rings they wait in for the
// optimizer stage (session.h). The rest of the session is session.cpp.
#include <algorithm>
#include <string>

#include "engine/gradient_sum.h"
#include "engine/session.h"

namespace strata::engine {

Status Session::set_gradient_order(std::vector<size_t> order) {
  STRATA_RETURN_IF_ERROR(usable("set_gradient_order"));
  if (in_step_) return failed_precondition("session: set_gradient_order during a step (end_step first)");
  std::vector<bool> seen(specs_.size(), false);
  bool permutation = order.size() == specs_.size();
  for (size_t c : order) {
    permutation = permutation && c < specs_.size() && !seen[c];
    if (c < specs_.size()) seen[c] = true;
  }
  if (!permutation || order.empty()) {
    return invalid_argument("session: set_gradient_order: name each of the " + std::to_string(specs_.size()) +
                            " registered chunks once");
  }
  landing_order_ = std::move(order);
  return ok_status();
}

// Two buffers of the largest chunk's gradient per ring slot, on the swap
// store's alignment and padded to it, as the stage's NVMe writes need.
Status Session::make_rings(int64_t largest) {
  const SessionOptions& o = options_;
  const auto n = static_cast<uint64_t>(largest);
  for (int k = 0; k < o.gradient_buffers; ++k) {
    STRATA_ASSIGN_OR_RETURN(io::Buffer grad,
                            allocator_->allocate(swap_->padded_size(n * dtype_bytes(o.precision)), swap_->alignment()));
    STRATA_ASSIGN_OR_RETURN(gpu::HostPin pin, gpu::HostPin::make(*device_, grad.data(), grad.capacity_bytes()));
    pins_.push_back(std::move(pin));
    ring_.push_back(std::move(grad));
    if (o.grad_accum > 1) {
      STRATA_ASSIGN_OR_RETURN(io::Buffer sum, allocator_->allocate(swap_->padded_size(n * 4), swap_->alignment()));
      sum_ring_.push_back(std::move(sum));
    }
  }
  return ok_status();
}

// Gradients on NVMe: micro-batch `micro_batch` of `chunk` may go into its
// ring buffer only as the next of the gradient order (the stage releases
// the buffers in that order, so any other would wait for a gradient never
// submitted); the first waits for the stage to be done with the chunk that
// used the buffer last.
Status Session::ring_ready(size_t chunk, int micro_batch) const {
  const size_t k = landed_now_.size();  // the position the next chunk takes
  const size_t expected = landing_order_[k];
  if (chunk != expected) {
    const std::string& name = specs_[chunk].name;
    if (submits_[expected] > 0) {
      return failed_precondition("session: submit_gradient \"" + name + "\": with the gradients on NVMe a chunk's " +
                                 std::to_string(options_.grad_accum) + " micro-batches come one after another, and \"" +
                                 specs_[expected].name + "\" has " + std::to_string(submits_[expected]) + " so far");
    }
    return failed_precondition("session: submit_gradient \"" + name +
                               "\": with the gradients on NVMe they come in the gradient order "
                               "(set_gradient_order), which has \"" +
                               specs_[expected].name + "\" next");
  }
  const size_t R = ring_.size();
  if (micro_batch > 0 || k < R) return ok_status();
  return stage_->wait_gradients_released(k - R + 1).with_context("session: a gradient buffer of the ring");
}

Result<void*> Session::gradient_buffer(size_t chunk) {
  STRATA_RETURN_IF_ERROR(check_chunk("gradient_buffer", chunk));
  if (all_in(chunk)) {
    return failed_precondition("session: gradient_buffer \"" + specs_[chunk].name +
                               "\": its gradient was submitted this step");
  }
  if (grad_held_[chunk] != nullptr) return grad_held_[chunk];  // asked again: the same buffer
  // The resident chunk's one buffer: an earlier micro-batch's copy out of it first.
  if (resident(chunk) && submits_[chunk] > 0) STRATA_RETURN_IF_ERROR(store_->await_gradient(chunk));
  // On a stream-ordered step the slot's last copy out follows the model's
  // compute: waiting for it is the host waiting for the device, not the
  // device for a copy (device_wait_s).
  meter_.set_counting(!stream_ordered_step_);
  Result<void*> slot = store_->gradient_buffer(chunk);
  meter_.set_counting(true);
  STRATA_ASSIGN_OR_RETURN(void* buffer, std::move(slot));
  grad_held_[chunk] = buffer;
  return buffer;
}

Status Session::submit_gradient(size_t chunk, gpu::Stream stream) {
  STRATA_RETURN_IF_ERROR(check_chunk("submit_gradient", chunk));
  if (stream.id >= 0 && grad_held_[chunk] != nullptr && !all_in(chunk)) {
    // The copy out follows what the stream has queued so far (the compute
    // of the gradient); nothing waits on the host.
    STRATA_ASSIGN_OR_RETURN(gpu::Event computed, device_->record(stream));
    STRATA_RETURN_IF_ERROR(device_->stream_wait(store_->gradient_stream(), computed));
  }
  return submit_gradient(chunk);
}

Status Session::submit_gradient(size_t chunk) {
  STRATA_RETURN_IF_ERROR(check_chunk("submit_gradient", chunk));
  const std::string& name = specs_[chunk].name;
  const int64_t A = options_.grad_accum;
  if (all_in(chunk)) {
    return failed_precondition(
        "session: submit_gradient \"" + name + "\": submitted " +
        (A == 1 ? std::string("twice") : "more than grad_accum = " + std::to_string(A) + " times in a step"));
  }
  if (grad_held_[chunk] == nullptr) {
    return failed_precondition("session: submit_gradient \"" + name +
                               "\": no gradient computed (gradient_buffer first)");
  }
  const int k = submits_[chunk];  // this micro-batch
  if (gradient_ring()) STRATA_RETURN_IF_ERROR(ring_ready(chunk, k));
  // The host buffer takes this gradient only once the last one's sum is made.
  if (k > 0) STRATA_RETURN_IF_ERROR(accumulator_->drain().with_context("session: adding up the gradients"));
  STRATA_RETURN_IF_ERROR(store_->send_gradient(chunk, grad_host(chunk)));
  ChunkStore* store = store_.get();
  grad_held_[chunk] = nullptr;
  ++submits_[chunk];
  // The delayed update: every micro-batch's is added on the accumulator's
  // thread, and the update takes them all at end_step.
  const bool delayed = options_.delayed_update;
  if (k + 1 < A || (delayed && A > 1)) {
    if (!accumulator_) accumulator_ = std::make_unique<SerialQueue>("strata:accum");
    accumulator_->submit(adding([store, chunk] { return store->await_gradient(chunk); }, chunk, /*first=*/k == 0));
    if (k + 1 < A) return ok_status();
  }
  if (delayed) {
    landed_now_.push_back(chunk);
    return ok_status();
  }
  std::function<Status()> landed = [store, chunk] { return store->await_gradient(chunk); };
  stage_->land(chunk, A == 1 ? std::move(landed) : adding(std::move(landed), chunk, /*first=*/false));
  landed_now_.push_back(chunk);
  return ok_status();
}

// The chunk's gradient, once `landed` says it is on the host, added into
// its fp32 sum (or starting it): on the accumulator's thread for an earlier
// micro-batch, on the optimizer stage's for the last.
std::function<Status()> Session::adding(std::function<Status()> landed, size_t chunk, bool first) {
  return add_gradient_when(std::move(landed), sum_host(chunk), grad_host(chunk), specs_[chunk].dtype,
                           static_cast<size_t>(specs_[chunk].elems), first, *executor_);
}

}  // namespace strata::engine
