// Session's reads of a chunk's weights beyond one acquire per use in a
// step (session.h: acquire): a chunk acquired again while it is held, and
// the evaluation pass that an acquire outside a step opens.
#include <string>
#include <vector>

#include "engine/session.h"

namespace strata::engine {

// A chunk acquired again while held: the same weights, one more hold. On
// the stream of the first acquire (or none): what waits for the weights
// there already does; another stream would need its own wait and its own
// release order, and is refused.
Result<const void*> Session::acquire_held(size_t chunk, gpu::Stream stream) {
  const gpu::Stream first = acquired_on_[chunk];
  if (stream.id >= 0 && first.id >= 0 && stream.id != first.id) {
    return invalid_argument("session: acquire \"" + specs_[chunk].name +
                            "\": held, acquired on another stream; acquire it again on that one");
  }
  ++holds_[chunk];
  return uses_[chunk]->data;
}

Status Session::check_read(const char* call, size_t chunk) const {
  if (in_step_ || eval_open_) {
    STRATA_RETURN_IF_ERROR(usable(call));
    return registered(call, chunk);
  }
  return check_chunk(call, chunk);
}

Status Session::open_eval() {
  STRATA_RETURN_IF_ERROR(usable("acquire"));
  STRATA_RETURN_IF_ERROR(start());
  if (!broken_.empty()) return failed_precondition("session: " + broken_ + "; load a checkpoint to continue");
  STRATA_RETURN_IF_ERROR(drain_update().with_context("session: acquire outside a step"));  // the weights to read
  STRATA_RETURN_IF_ERROR(restore_stale());
  store_->begin_aside();  // the evaluation's order is not the steps'
  if (Status begun = store_->begin_step(host_weights()); !begun.ok()) {
    store_->drain();
    store_->end_aside();
    return begun.with_context("session: acquire outside a step");
  }
  uses_.assign(specs_.size(), std::nullopt);
  holds_.assign(specs_.size(), 0);
  acquired_on_.assign(specs_.size(), gpu::Stream{});
  eval_open_ = true;
  return ok_status();
}

Status Session::close_eval(const char* call) {
  if (!eval_open_) return ok_status();
  for (size_t c = 0; c < specs_.size(); ++c) {
    if (uses_[c]) {
      return failed_precondition(std::string("session: ") + call + ": chunk \"" + specs_[c].name +
                                 "\" is still acquired outside a step; release it first");
    }
  }
  store_->drain();  // the pass's reads ahead land
  store_->end_aside();
  eval_open_ = false;
  return ok_status();
}

}  // namespace strata::engine
