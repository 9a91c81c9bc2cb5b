#include "io/io_queue.h"

#include <algorithm>

#include "common/log.h"
#include "common/units.h"

namespace strata::io {

IoQueue::IoQueue(BlockDevice& device, IoQueueOptions options) : device_(device), options_(options) {
  STRATA_CHECK(options_.max_pending > 0);
  pending_.resize(options_.max_pending);
  free_ids_.reserve(options_.max_pending);
  for (uint32_t id = options_.max_pending; id-- > 0;) free_ids_.push_back(id);
  reaped_.resize(std::max<uint32_t>(device_.queue_depth(), 1));
}

IoQueue::~IoQueue() {
  // Drop what the device has not seen; wait for what it has.
  for (uint32_t id : backlog_) {
    pending_[id].active = false;
    free_ids_.push_back(id);
    --active_count_;
  }
  backlog_.clear();
  while (device_.in_flight() > 0) {
    Status status = reap_some(1);
    if (!status.ok()) {
      log_warning("IoQueue shutdown: " + status.to_string());
      break;
    }
  }
}

Result<int32_t> IoQueue::attach(int fd, std::string label, uint64_t alignment) {
  STRATA_CHECK(is_power_of_two(alignment));
  STRATA_ASSIGN_OR_RETURN(int32_t slot, device_.attach_file(fd));
  if (static_cast<size_t>(slot) >= files_.size()) files_.resize(static_cast<size_t>(slot) + 1);
  files_[static_cast<size_t>(slot)] = FileInfo{std::move(label), alignment, true};
  return slot;
}

Status IoQueue::detach(int32_t slot) {
  STRATA_CHECK(slot >= 0 && static_cast<size_t>(slot) < files_.size() && files_[static_cast<size_t>(slot)].attached);
  files_[static_cast<size_t>(slot)].attached = false;
  return device_.detach_file(slot);
}

std::string IoQueue::describe(const IoRequest& r) const {
  const std::string& label = files_[static_cast<size_t>(r.file_slot)].label;
  return std::string(io_op_name(r.op)) + " " + std::to_string(r.length_bytes) + " bytes at offset " +
         std::to_string(r.offset_bytes) + " of " + label;
}

Status IoQueue::submit(const IoRequest& request) {
  STRATA_CHECK_MSG(request.file_slot >= 0 && static_cast<size_t>(request.file_slot) < files_.size() &&
                       files_[static_cast<size_t>(request.file_slot)].attached,
                   "file slot %d is not attached", request.file_slot);
  const FileInfo& file = files_[static_cast<size_t>(request.file_slot)];
  if (request.length_bytes == 0 || request.length_bytes > kMaxRequestBytes) {
    return invalid_argument(describe(request) + ": length must be 1.." + std::to_string(kMaxRequestBytes));
  }
  if (!is_aligned(request.offset_bytes, file.alignment) || !is_aligned(request.length_bytes, file.alignment) ||
      !is_aligned(request.data, file.alignment)) {
    return invalid_argument(describe(request) + ": buffer address, offset and length must be multiples of " +
                            std::to_string(file.alignment) + " bytes for direct I/O");
  }
  if (free_ids_.empty()) {
    return resource_exhausted(describe(request) + ": I/O queue holds its maximum of " +
                              std::to_string(options_.max_pending) + " requests; wait for some to finish");
  }
  uint32_t id = free_ids_.back();
  free_ids_.pop_back();
  Pending& p = pending_[id];
  p.request = request;
  p.progress = RequestProgress{request.op, request.length_bytes, 0, file.alignment, 0, 0, 0};
  p.active = true;
  ++active_count_;
  backlog_.push_back(id);
  pump();
  return ok_status();
}

void IoQueue::pump() {
  uint32_t depth = device_.queue_depth();
  while (!backlog_.empty() && device_.in_flight() < depth) {
    size_t room = std::min<size_t>(depth - device_.in_flight(), backlog_.size());
    batch_.clear();
    for (size_t i = 0; i < room; ++i) {
      uint32_t id = backlog_[i];
      const Pending& p = pending_[id];
      RawRequest raw;
      raw.op = p.request.op;
      raw.file_slot = p.request.file_slot;
      raw.offset_bytes = p.request.offset_bytes + p.progress.done_bytes;
      raw.data = p.request.data + p.progress.done_bytes;
      raw.length_bytes = static_cast<uint32_t>(p.request.length_bytes - p.progress.done_bytes);
      raw.tag = id;
      batch_.push_back(raw);
    }
    Status status = device_.submit(batch_);
    if (!status.ok()) {
      // finish() touches only ready_ and the free list, not the backlog.
      for (size_t i = 0; i < room; ++i) {
        const uint32_t id = backlog_[i];
        finish(id, status.with_context(describe(pending_[id].request) + ": submit"));
      }
    }
    backlog_.erase(backlog_.begin(), backlog_.begin() + static_cast<std::ptrdiff_t>(room));
  }
}

Status IoQueue::reap_some(size_t min_complete) {
  Result<size_t> n = device_.reap(reaped_, min_complete);
  if (!n) return std::move(n).error().with_context(std::string(device_.name()) + " reap");
  for (size_t i = 0; i < *n; ++i) on_completion(reaped_[i]);
  return ok_status();
}

void IoQueue::on_completion(const RawCompletion& completion) {
  STRATA_CHECK_MSG(completion.tag < pending_.size() && pending_[completion.tag].active,
                   "completion for unknown request tag %llu", static_cast<unsigned long long>(completion.tag));
  uint32_t id = static_cast<uint32_t>(completion.tag);
  Pending& p = pending_[id];
  Decision d = decide_completion(p.progress, completion.res, options_.retry);
  switch (d.action) {
    case NextAction::kComplete:
      finish(id, ok_status());
      break;
    case NextAction::kResubmitRemainder:
    case NextAction::kRetry:
      backlog_.push_front(id);
      break;
    case NextAction::kFail:
      finish(id, Status(d.code, describe(p.request) + ": " + d.reason));
      break;
  }
}

void IoQueue::finish(uint32_t id, Status status) {
  Pending& p = pending_[id];
  ready_.push_back(IoResult{p.request.tag, std::move(status)});
  p.active = false;
  free_ids_.push_back(id);
  --active_count_;
}

Result<size_t> IoQueue::wait(size_t min_results, std::vector<IoResult>& out) {
  min_results = std::min(min_results, outstanding());
  pump();
  while (ready_.size() < min_results) {
    if (device_.in_flight() == 0) {
      pump();
      STRATA_CHECK_MSG(device_.in_flight() > 0 || ready_.size() >= min_results,
                       "IoQueue: results outstanding but nothing in flight");
      continue;
    }
    STRATA_RETURN_IF_ERROR(reap_some(1));
    pump();
  }
  size_t n = ready_.size();
  for (IoResult& r : ready_) out.push_back(std::move(r));
  ready_.clear();
  return n;
}

}  // namespace strata::io
