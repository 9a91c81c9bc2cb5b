// Session's saved activations (session.h: save_activation,
// prefetch_activation, load_activation): a model's tensors off the device
// between its forward and its backward, in host RAM (pinned, one buffer per
// key) or on NVMe (a blob per key, written from a staging buffer while the
// model goes on). A prefetch
// starts a load on a copy stream of its own — from NVMe the read, then the
// copy — and the load that follows waits only for what is left of it, so
// the model computes while its next input comes back.
#include <memory>
#include <string>

#include "common/units.h"
#include "engine/session.h"

namespace strata::engine {

Status Session::save_activation(uint64_t key, const void* device_src, uint64_t bytes) {
  return save_activation(key, device_src, bytes, gpu::Stream{});
}

// A save: the copy out on the session's copy stream, after `stream`'s work
// (returning at once) or waited for (no stream: id < 0).
Status Session::save_activation(uint64_t key, const void* device_src, uint64_t bytes, gpu::Stream stream) {
  STRATA_RETURN_IF_ERROR(usable("save_activation"));
  if (!started()) return failed_precondition("session: save_activation before start");
  if (device_src == nullptr || bytes == 0) {
    return invalid_argument("session: save_activation " + std::to_string(key) + ": no bytes to save");
  }
  // A load of the old contents in flight lands first (a failed read of
  // them is moot: they are replaced); so does a copy of them out.
  STRATA_RETURN_IF_ERROR(drain_prefetch(key, /*report_read=*/false));
  STRATA_RETURN_IF_ERROR(drain_save(key));
  issue_copied_writes();
  gpu::Event written;  // the model's writes the copy follows
  const bool ordered = stream.id >= 0;
  if (ordered) {
    STRATA_ASSIGN_OR_RETURN(written, device_->record(stream));
    STRATA_RETURN_IF_ERROR(device_->stream_wait(copy_, written));
  }
  if (options_.activations == Tier::kNvme) {
    // The old contents' write lands first; then a staging buffer of the
    // write's own (the oldest write lands when both are taken).
    // A failed write of the old contents is moot: they are replaced. One of
    // another key's keeps its failure for that key's load.
    drain_write(key);
    failed_writes_.erase(key);
    while (writes_.size() >= kWriteStaging) drain_write(writes_.begin()->first);
    bool used[kWriteStaging] = {};
    for (const auto& [k, w] : writes_) used[w.staging] = true;
    Write w;
    while (used[w.staging]) ++w.staging;
    io::Buffer& staging = write_staging_[w.staging];
    STRATA_RETURN_IF_ERROR(stage_activation(bytes, &staging, &write_staging_pin_[w.staging]));
    STRATA_RETURN_IF_ERROR(device_->copy_to_host(copy_, staging.data(), device_src, bytes));
    activation_d2h_bytes_ += bytes;
    STRATA_ASSIGN_OR_RETURN(w.copy.done, device_->record(copy_));
    w.issued = false;
    w.copy.after_model = written;
    activations_[key].bytes = bytes;
    Write& held = writes_[key] = w;
    if (ordered) return ok_status();
    // Blocking: the bytes are off the device and the write in flight, or
    // the save fails here with nothing of it kept.
    issue_write(key, held);
    if (!held.failed) return ok_status();
    Status failed = std::move(failed_writes_.at(key).status);
    failed_writes_.erase(key);
    writes_.erase(key);
    activations_[key].bytes = 0;
    return failed;
  }
  STRATA_RETURN_IF_ERROR(host_activation(key, bytes));
  Activation& a = activations_[key];
  STRATA_RETURN_IF_ERROR(device_->copy_to_host(copy_, a.host.data(), device_src, bytes));
  activation_d2h_bytes_ += bytes;
  a.bytes = bytes;
  if (!ordered) return device_->synchronize(copy_);
  STRATA_ASSIGN_OR_RETURN(gpu::Event copied, device_->record(copy_));
  saves_[key] = {written, copied};
  return ok_status();
}

// Activation `key`'s pinned host buffer, of `bytes`, within the host budget.
Status Session::host_activation(uint64_t key, uint64_t bytes) {
  Activation& a = activations_[key];
  if (a.host.size() == bytes) return ok_status();
  const uint64_t grows = bytes > a.host.size() ? bytes - a.host.size() : 0;
  if (options_.host_budget_bytes > 0 && host_bytes() + grows > options_.host_budget_bytes) {
    return resource_exhausted("session: activation " + std::to_string(key) + " (" + format_bytes(bytes) +
                              ") would take the host memory past the host budget of " +
                              format_bytes(options_.host_budget_bytes) +
                              " (budgets.host); put the activations on NVMe");
  }
  a.pin = gpu::HostPin();
  a.host = AlignedVector<std::byte>(bytes);
  STRATA_ASSIGN_OR_RETURN(a.pin, gpu::HostPin::make(*device_, a.host.data(), bytes));
  return ok_status();
}

Status Session::activation_saved(uint64_t key, gpu::Stream stream) {
  STRATA_RETURN_IF_ERROR(usable("activation_saved"));
  if (stream.id < 0) return invalid_argument("session: activation_saved: no stream to make wait");
  if (!activations_.contains(key)) {
    return not_found("session: activation_saved: no activation " + std::to_string(key) + " was saved");
  }
  if (const auto it = saves_.find(key); it != saves_.end()) return device_->stream_wait(stream, it->second.done);
  if (const auto it = writes_.find(key); it != writes_.end() && !it->second.issued) {
    return device_->stream_wait(stream, it->second.copy.done);
  }
  return ok_status();  // its copy was waited for
}

// Waits for a stream-ordered save's copy of `key` into host RAM, if any.
Status Session::drain_save(uint64_t key) {
  const auto it = saves_.find(key);
  if (it == saves_.end()) return ok_status();
  const ActivationCopy copy = it->second;
  saves_.erase(it);
  return wait_copy(copy).with_context("session: saving activation " + std::to_string(key));
}

Status Session::wait_copy(const ActivationCopy& copy) {
  if (copy.after_model.id >= 0) STRATA_RETURN_IF_ERROR(device_->synchronize(copy.after_model));
  return meter_.wait(*device_, copy.done, "activation");
}

// Issues the write of a save whose copy into its staging buffer is
// waited for here; a failure (of the copy or of the write's submission)
// stays with the key, as a failed write's does.
void Session::issue_write(uint64_t key, Write& w) {
  if (w.issued) return;
  w.issued = true;
  Status copied = wait_copy(w.copy);
  if (copied.ok()) {
    Result<io::Ticket> t =
        swap_->write(activation_blob(key), write_staging_[w.staging].view(), activations_.at(key).bytes);
    if (t) {
      w.ticket = *t;
      return;
    }
    copied = t.status();
  }
  failed_writes_[key] = {copied.with_context("session: saving activation " + std::to_string(key)), false};
  w.failed = true;
}

// The stream-ordered saves whose copies have landed get their writes.
void Session::issue_copied_writes() {
  for (auto& [key, w] : writes_) {
    if (!w.issued && device_->done(w.copy.done)) issue_write(key, w);
  }
}

// What a load or prefetch of `key` into `device_dst` may take: a saved
// activation of exactly `bytes`.
Status Session::check_activation(const char* call, uint64_t key, const void* device_dst, uint64_t bytes) const {
  const auto it = activations_.find(key);
  if (it == activations_.end() || it->second.bytes == 0) {
    return not_found(std::string("session: ") + call + ": no activation " + std::to_string(key) + " was saved");
  }
  if (device_dst == nullptr || bytes != it->second.bytes) {
    return invalid_argument(std::string("session: ") + call + " " + std::to_string(key) + ": it holds " +
                            std::to_string(it->second.bytes) + " bytes, asked for " + std::to_string(bytes));
  }
  return ok_status();
}

Status Session::prefetch_activation(uint64_t key, void* device_dst, uint64_t bytes) {
  return prefetch_activation(key, device_dst, bytes, gpu::Stream{});
}

// A prefetch whose copy up follows `stream`'s work so far (when given).
Status Session::prefetch_activation(uint64_t key, void* device_dst, uint64_t bytes, gpu::Stream stream) {
  STRATA_RETURN_IF_ERROR(usable("prefetch_activation"));
  STRATA_RETURN_IF_ERROR(check_activation("prefetch_activation", key, device_dst, bytes));
  STRATA_RETURN_IF_ERROR(drain_prefetch(key));  // one load of a key at a time
  STRATA_RETURN_IF_ERROR(drain_save(key));      // its bytes are out before they come back
  issue_copied_writes();
  // A stream of their own: a read from NVMe holds up only the copies of
  // activations after it, never the weights' prefetches.
  if (prefetch_copy_.id < 0) {
    STRATA_ASSIGN_OR_RETURN(prefetch_copy_, device_->create_stream("activation prefetch"));
  }
  Prefetch p;
  p.dst = device_dst;
  const void* src = activations_.at(key).host.data();
  if (options_.activations == Tier::kNvme) {
    // A staging buffer of its own until the copy out of it is done: the
    // oldest prefetch's lands first when both are taken.
    while (prefetches_.size() >= kPrefetchStaging) STRATA_RETURN_IF_ERROR(drain_prefetch(prefetches_.begin()->first));
    bool used[kPrefetchStaging] = {};
    for (const auto& [k, q] : prefetches_) used[q.staging] = true;
    while (used[p.staging]) ++p.staging;
    drain_write(key);  // the blob is whole before it is read, or its write failed
    if (const auto failed = failed_writes_.find(key); failed != failed_writes_.end()) {
      failed->second.reported = true;
      return failed->second.status;
    }
    io::Buffer& staging = prefetch_staging_[p.staging];
    STRATA_RETURN_IF_ERROR(stage_activation(bytes, &staging, &prefetch_staging_pin_[p.staging]));
    STRATA_ASSIGN_OR_RETURN(io::Ticket t, swap_->read(activation_blob(key), staging.view()));
    // The copy stream waits for the read: the copy up follows it in order.
    // The read's outcome goes to the load that waits for it (not to the
    // device's errors, which other work reads).
    io::SwapStore* swap = swap_.get();
    p.read = std::make_shared<Status>();
    STRATA_RETURN_IF_ERROR(device_->enqueue(prefetch_copy_, [swap, t, key, read = p.read]() -> Status {
      *read = swap->wait(t).with_context("session: prefetching activation " + std::to_string(key));
      return ok_status();
    }));
    src = staging.data();
  }
  if (stream.id >= 0) {
    STRATA_ASSIGN_OR_RETURN(p.copy.after_model, device_->record(stream));  // its reads of the buffer
    STRATA_RETURN_IF_ERROR(device_->stream_wait(prefetch_copy_, p.copy.after_model));
  }
  STRATA_RETURN_IF_ERROR(device_->copy_to_device(prefetch_copy_, device_dst, src, bytes));
  activation_h2d_bytes_ += bytes;
  STRATA_ASSIGN_OR_RETURN(p.copy.done, device_->record(prefetch_copy_));
  prefetches_[key] = p;
  return ok_status();
}

// Waits for a write of `key` in flight, if any, and forgets it; a failure
// stays with the key (failed_writes_) for its next load or finalize.
void Session::drain_write(uint64_t key) {
  const auto it = writes_.find(key);
  if (it == writes_.end()) return;
  issue_write(key, it->second);
  if (it->second.failed) {
    writes_.erase(it);  // never written: its failure is kept
    return;
  }
  const io::Ticket t = it->second.ticket;
  writes_.erase(it);
  Status written = swap_->wait(t).with_context("session: saving activation " + std::to_string(key));
  if (!written.ok()) failed_writes_[key] = {std::move(written), false};
}

// Waits for a prefetch of `key` in flight, if any, and forgets it; the
// read's failure is returned when `report_read` (its bytes are wanted).
Status Session::drain_prefetch(uint64_t key, bool report_read) {
  const auto it = prefetches_.find(key);
  if (it == prefetches_.end()) return ok_status();
  const Prefetch p = it->second;
  prefetches_.erase(it);
  // What the model waits here is what the prefetch did not hide.
  STRATA_RETURN_IF_ERROR(wait_copy(p.copy).with_context("session: activation " + std::to_string(key)));
  return p.read && report_read ? *p.read : ok_status();
}

// The prefetches in flight land and are forgotten, their reads' outcomes
// with them: a cancelled step's copies write into no buffer of the model's
// after it, and a failed read of one is no later step's error.
void Session::drop_prefetches() {
  while (!prefetches_.empty()) drain_prefetch(prefetches_.begin()->first, /*report_read=*/false).ignore();
}

Status Session::load_activation(uint64_t key, void* device_dst, uint64_t bytes) {
  return load_activation(key, device_dst, bytes, gpu::Stream{});
}

Status Session::load_activation(uint64_t key, void* device_dst, uint64_t bytes, gpu::Stream stream) {
  STRATA_RETURN_IF_ERROR(usable("load_activation"));
  STRATA_RETURN_IF_ERROR(check_activation("load_activation", key, device_dst, bytes));
  const auto pending = prefetches_.find(key);
  if (pending != prefetches_.end()) {
    const bool same = pending->second.dst == device_dst;
    STRATA_RETURN_IF_ERROR(drain_prefetch(key));
    if (same) return ok_status();  // it is there
  }
  // Not prefetched (or into another buffer): the same path, waited for.
  STRATA_RETURN_IF_ERROR(prefetch_activation(key, device_dst, bytes, stream));
  return drain_prefetch(key).with_context("session: loading activation " + std::to_string(key));
}

// An NVMe activations' staging buffer, grown to hold `bytes` (padded).
Status Session::stage_activation(uint64_t bytes, io::Buffer* buffer, gpu::HostPin* pin) {
  const uint64_t need = swap_->padded_size(bytes);
  if (buffer->capacity_bytes() >= need) return ok_status();
  *pin = gpu::HostPin();
  *buffer = io::Buffer();
  STRATA_ASSIGN_OR_RETURN(*buffer, allocator_->allocate(need, swap_->alignment()));
  STRATA_ASSIGN_OR_RETURN(*pin, gpu::HostPin::make(*device_, buffer->data(), buffer->capacity_bytes()));
  return ok_status();
}

void Session::drop_activations() {
  drop_prefetches();
  while (!saves_.empty()) drain_save(saves_.begin()->first).ignore();
  while (!writes_.empty()) drain_write(writes_.begin()->first);
  failed_writes_.clear();
  for (const auto& [key, a] : activations_) {
    if (options_.activations == Tier::kNvme && a.bytes > 0) swap_->remove(activation_blob(key)).ignore();
  }
  activations_.clear();
}

}  // namespace strata::engine
