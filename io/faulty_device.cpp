#include "io/faulty_device.h"

#include <algorithm>
#include <cerrno>
#include <thread>

#include "common/units.h"

namespace strata::io {

FaultyDevice::FaultyDevice(BlockDevice& inner, const FaultConfig& config)
    : inner_(inner), config_(config), rng_(config.seed) {
  scratch_.resize(std::max<uint32_t>(inner_.queue_depth(), 1));
}

FaultyDevice::~FaultyDevice() {
  // IoQueue drains before its device goes; a wrapper dying with requests in
  // flight would orphan their completions.
  STRATA_CHECK_MSG(in_flight() == 0, "FaultyDevice destroyed with %u requests in flight", in_flight());
}

bool FaultyDevice::roll(uint32_t one_in) {
  if (!rates_enabled_ || one_in == 0) return false;
  return rng_() % one_in == 0;
}

bool FaultyDevice::overlaps_bad(const RawRequest& r) const {
  uint64_t end = r.offset_bytes + r.length_bytes;
  return std::any_of(bad_ranges_.begin(), bad_ranges_.end(), [&](const Range& b) {
    return b.slot == r.file_slot && r.offset_bytes < b.end && b.begin < end;
  });
}

// 0: forward unchanged; > 0: fail with -errno; -1: forward shortened.
int FaultyDevice::pick_fault(const RawRequest& r) {
  for (auto it = forced_.begin(); it != forced_.end(); ++it) {
    if (it->first == r.op) {
      int err = it->second;
      forced_.erase(it);
      if (err == 0) return 0;  // one that passes before the failures
      ++counters_.forced;
      return err;
    }
  }
  if (overlaps_bad(r)) {
    ++counters_.eio_persistent;
    return EIO;
  }
  if (roll(config_.eio_persistent_one_in)) {
    uint64_t begin = round_down(r.offset_bytes, 4096);
    bad_ranges_.push_back({r.file_slot, begin, begin + 4096});
    ++counters_.eio_persistent;
    return EIO;
  }
  if (r.op == IoOp::kWrite && roll(config_.enospc_one_in)) {
    ++counters_.enospc;
    return ENOSPC;
  }
  if (just_faulted_.erase(r.tag) == 0) {
    int transient = 0;
    if (roll(config_.eio_transient_one_in)) {
      ++counters_.eio_transient;
      transient = EIO;
    } else if (roll(config_.eagain_one_in)) {
      ++counters_.eagain;
      transient = EAGAIN;
    } else if (roll(config_.eintr_one_in)) {
      ++counters_.eintr;
      transient = EINTR;
    }
    if (transient != 0) {
      just_faulted_.insert(r.tag);
      return transient;
    }
  }
  if (r.length_bytes > 4096 && roll(config_.short_transfer_one_in)) {
    ++counters_.short_transfers;
    return -1;
  }
  return 0;
}

void FaultyDevice::hold(RawCompletion c) {
  Clock::time_point ready = Clock::now();
  if (roll(config_.latency_one_in)) {
    ++counters_.delayed;
    ready += std::chrono::microseconds(config_.latency_us);
  }
  held_.push_back({c, ready});
}

Status FaultyDevice::submit(std::span<const RawRequest> requests) {
  if (in_flight() + requests.size() > queue_depth()) {
    return resource_exhausted("faulty: " + std::to_string(requests.size()) + " requests exceed free queue depth");
  }
  std::vector<RawRequest> forward;
  std::vector<RawCompletion> answered;
  forward.reserve(requests.size());
  for (const RawRequest& r : requests) {
    int fault = pick_fault(r);
    if (fault > 0) {
      answered.push_back({r.tag, -static_cast<int64_t>(fault)});
      continue;
    }
    RawRequest sent = r;
    if (fault < 0) sent.length_bytes = static_cast<uint32_t>(std::max<uint64_t>(4096, round_down(r.length_bytes / 2, 4096)));
    if (auto end = file_end_.find(r.file_slot);
        r.op == IoOp::kRead && end != file_end_.end() && r.offset_bytes + sent.length_bytes > end->second) {
      ++counters_.past_end;
      if (r.offset_bytes >= end->second) {
        answered.push_back({r.tag, 0});  // the kernel's end of file: nothing transferred
        continue;
      }
      sent.length_bytes = static_cast<uint32_t>(end->second - r.offset_bytes);
    }
    forward.push_back(sent);
  }
  STRATA_RETURN_IF_ERROR(inner_.submit(forward));
  for (const RawRequest& r : forward) forwarded_[r.tag] = r;
  for (const RawCompletion& c : answered) hold(c);
  return ok_status();
}

void FaultyDevice::after_inner(const RawCompletion& c) {
  auto it = forwarded_.find(c.tag);
  STRATA_CHECK(it != forwarded_.end());
  RawRequest r = it->second;
  forwarded_.erase(it);
  if (c.res > 0) {
    uint64_t begin = r.offset_bytes;
    uint64_t end = begin + static_cast<uint64_t>(c.res);
    if (r.op == IoOp::kWrite) {
      // A rewrite heals a flipped byte; a rolled corruption then marks one anew.
      std::erase_if(corrupt_, [&](const auto& x) { return x.first == r.file_slot && x.second >= begin && x.second < end; });
      if (roll(config_.corrupt_one_in)) corrupt_.emplace_back(r.file_slot, begin + rng_() % (end - begin));
    } else {
      bool flipped = false;
      for (const auto& [slot, pos] : corrupt_) {
        if (slot == r.file_slot && pos >= begin && pos < end) {
          r.data[pos - begin] ^= std::byte{0x5A};
          flipped = true;
        }
      }
      if (flipped) ++counters_.corrupted_reads;
    }
  }
  hold(c);
}

size_t FaultyDevice::take_ready(std::span<RawCompletion> out, size_t n) {
  Clock::time_point now = Clock::now();
  if (config_.reorder && held_.size() > 1) std::shuffle(held_.begin(), held_.end(), rng_);
  for (auto it = held_.begin(); it != held_.end() && n < out.size();) {
    if (it->ready_at <= now) {
      out[n++] = it->completion;
      it = held_.erase(it);
    } else {
      ++it;
    }
  }
  return n;
}

Result<size_t> FaultyDevice::reap(std::span<RawCompletion> out, size_t min_complete) {
  size_t want = std::min<size_t>({min_complete, in_flight(), out.size()});
  size_t n = 0;
  for (;;) {
    // Gather whatever the inner device has, blocking only when nothing of
    // ours can satisfy the caller.
    bool must_block = held_.empty() && n < want;
    STRATA_ASSIGN_OR_RETURN(size_t got, inner_.reap(scratch_, must_block ? 1 : 0));
    for (size_t i = 0; i < got; ++i) after_inner(scratch_[i]);
    n = take_ready(out, n);
    if (n >= want) return n;
    if (!held_.empty() && got == 0) {
      auto earliest = std::min_element(held_.begin(), held_.end(),
                                       [](const Held& a, const Held& b) { return a.ready_at < b.ready_at; });
      std::this_thread::sleep_until(std::min(earliest->ready_at, Clock::now() + std::chrono::microseconds(100)));
    }
  }
}

void FaultyDevice::add_bad_range(int32_t slot, uint64_t offset_bytes, uint64_t length_bytes) {
  bad_ranges_.push_back({slot, offset_bytes, offset_bytes + length_bytes});
}

void FaultyDevice::corrupt_byte(int32_t slot, uint64_t offset_bytes) { corrupt_.emplace_back(slot, offset_bytes); }

void FaultyDevice::end_file_at(int32_t slot, uint64_t offset_bytes) {
  STRATA_CHECK(offset_bytes % 4096 == 0);
  file_end_[slot] = offset_bytes;
}

void FaultyDevice::fail_next(IoOp op, int err, uint32_t count, uint32_t after) {
  STRATA_CHECK(err > 0);
  for (uint32_t i = 0; i < after; ++i) forced_.emplace_back(op, 0);
  for (uint32_t i = 0; i < count; ++i) forced_.emplace_back(op, err);
}

}  // namespace strata::io
