// FaultyDevice: wraps any BlockDevice and injects the faults real NVMe and
// kernels produce, so every error path above it is tested, not hoped for.
// Seeded and replayable: the same seed and the same request sequence inject
// the same faults. Rates are 1-in-N per request (0 = off).
//
//   transient EIO     the request fails once with -EIO (a retry may succeed)
//   persistent EIO    the request's first 4 KiB becomes a bad block: every
//                     later request touching it fails with -EIO
//   short transfer    the request is forwarded with half its length
//                     (4 KiB-aligned), so the remainder must be resubmitted
//   ENOSPC            a write fails with -ENOSPC
//   EAGAIN / EINTR    the request fails with that errno
//   latency           the completion is held back `latency_us`
//   reorder           completions are returned in a shuffled order
//   corruption        a successful write marks one byte of its range bad;
//                     every later read covering it sees the byte flipped
//                     (a deterministic position, so retries do not mask it)
// Explicit faults (a bad range, a flipped byte, a file that ends early, the
// next N ops failing) are set with the methods below. counters() reports
// what was injected.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <random>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "io/block_device.h"

namespace strata::io {

// Rates are "one in N" submissions (0: never). Transient faults (EIO
// transient, EAGAIN, EINTR) never strike the immediate retry of the request
// they hit: transient means the retry works, so a test of recovery cannot
// fail by chance; the retry limits themselves are tested with fail_next().
struct FaultConfig {
  uint64_t seed = 1;
  uint32_t eio_transient_one_in = 0;
  uint32_t eio_persistent_one_in = 0;
  uint32_t short_transfer_one_in = 0;
  uint32_t enospc_one_in = 0;
  uint32_t eagain_one_in = 0;
  uint32_t eintr_one_in = 0;
  uint32_t latency_one_in = 0;
  uint32_t latency_us = 200;
  uint32_t corrupt_one_in = 0;
  bool reorder = false;
};

struct FaultCounters {
  uint64_t eio_transient = 0;
  uint64_t eio_persistent = 0;  // requests failed on a bad block
  uint64_t short_transfers = 0;
  uint64_t enospc = 0;
  uint64_t eagain = 0;
  uint64_t eintr = 0;
  uint64_t delayed = 0;
  uint64_t corrupted_reads = 0;  // reads that returned a flipped byte
  uint64_t past_end = 0;         // reads cut short by end_file_at()
  uint64_t forced = 0;           // from fail_next()
};

class FaultyDevice final : public BlockDevice {
 public:
  FaultyDevice(BlockDevice& inner, const FaultConfig& config);
  ~FaultyDevice() override;

  std::string_view name() const override { return "faulty"; }
  uint32_t queue_depth() const override { return inner_.queue_depth(); }
  uint32_t in_flight() const override { return inner_.in_flight() + static_cast<uint32_t>(held_.size()); }

  Result<int32_t> attach_file(int fd) override { return inner_.attach_file(fd); }
  Status detach_file(int32_t slot) override { return inner_.detach_file(slot); }
  Status register_buffer(std::span<std::byte> region) override { return inner_.register_buffer(region); }
  Status unregister_buffer(std::span<std::byte> region) override { return inner_.unregister_buffer(region); }
  Status submit(std::span<const RawRequest> requests) override;
  Result<size_t> reap(std::span<RawCompletion> out, size_t min_complete) override;

  // Every request overlapping [offset, offset+length) of `slot` fails with -EIO.
  void add_bad_range(int32_t slot, uint64_t offset_bytes, uint64_t length_bytes);
  // Reads covering `offset` of `slot` see that byte flipped until it is rewritten.
  void corrupt_byte(int32_t slot, uint64_t offset_bytes);
  // Reads of `slot` find the end of the file at `offset` (4 KiB-aligned), as
  // if it had been truncated there: one that starts at or past it transfers
  // nothing, one that crosses it stops there. Writes are not affected.
  void end_file_at(int32_t slot, uint64_t offset_bytes);
  // After the next `after` requests of kind `op` (which pass), the `count`
  // following ones fail with -err (err > 0).
  void fail_next(IoOp op, int err, uint32_t count = 1, uint32_t after = 0);
  // Drops the fail_next() faults not yet used.
  void clear_forced() { forced_.clear(); }
  // Turns rate-based faults off (explicit ones stay); for clean verification passes.
  void set_rates_enabled(bool enabled) { rates_enabled_ = enabled; }

  const FaultCounters& counters() const { return counters_; }

 private:
  using Clock = std::chrono::steady_clock;
  struct Held {
    RawCompletion completion;
    Clock::time_point ready_at;
  };
  struct Range {
    int32_t slot;
    uint64_t begin;
    uint64_t end;
  };

  bool roll(uint32_t one_in);
  int pick_fault(const RawRequest& r);
  bool overlaps_bad(const RawRequest& r) const;
  void after_inner(const RawCompletion& c);
  void hold(RawCompletion c);
  size_t take_ready(std::span<RawCompletion> out, size_t n);

  BlockDevice& inner_;
  FaultConfig config_;
  std::mt19937_64 rng_;
  bool rates_enabled_ = true;
  FaultCounters counters_;
  std::vector<Range> bad_ranges_;
  std::vector<std::pair<int32_t, uint64_t>> corrupt_;  // (slot, byte offset)
  std::unordered_map<int32_t, uint64_t> file_end_;     // slot -> end seen by reads
  std::deque<std::pair<IoOp, int>> forced_;  // per request of the kind, in turn: -errno, or 0 to pass
  std::unordered_map<uint64_t, RawRequest> forwarded_;  // tag -> request as sent
  std::unordered_set<uint64_t> just_faulted_;             // tags whose last submission got a transient fault
  std::deque<Held> held_;
  std::vector<RawCompletion> scratch_;
};

}  // namespace strata::io
