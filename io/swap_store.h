// SwapStore: named blobs on one or more NVMe directories.
//
// Each directory holds one swap file (created unlinked, so a crash leaves no
// garbage; the store is scratch space — checkpoints are written elsewhere).
// A blob of S bytes is cut into stripe units; unit k lives in directory
// (first + k) mod D, so D drives give up to D times the bandwidth with no
// RAID. Each unit is one I/O request and carries an xxh3-64 checksum of its
// bytes, verified on read (on by default). Space comes from a per-directory
// first-fit allocator and is accounted against a byte budget; going over it
// is ResourceExhausted naming the budget, and a full disk is
// ResourceExhausted naming the file.
//
// Operations are asynchronous: write()/read() submit and return a Ticket;
// wait(ticket) returns its Status. Overwriting a blob of the same size reuses
// its extents in place; while a write is in flight the blob is unreadable,
// and a failed write leaves the blob invalid (reads say DataLoss and why) —
// never readable as if the write had worked.
//
// Buffers: address aligned to alignment(), capacity >= padded_size(S). Bytes
// between S and the padded size are written as they are and are not checked.
// The caller must not touch a buffer until its ticket has been waited for.
// Thread-safe: one mutex guards the store; a thread blocked in wait() holds
// it only until the next completion arrives (its own or another thread's),
// so threads sharing the store share its ring.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "io/buffer.h"
#include "io/device_factory.h"
#include "io/faulty_device.h"
#include "io/file.h"
#include "io/io_queue.h"

namespace strata::io {

inline constexpr uint64_t kUnlimitedBytes = ~0ull;

// One finished request, as handed to SwapStoreOptions::on_complete.
struct SwapRequestRecord {
  IoOp kind = IoOp::kRead;
  const std::string* blob = nullptr;
  uint64_t bytes = 0;
  std::chrono::steady_clock::time_point submitted, completed;  // completed: when its last piece was reaped
  bool ok = true;
};

struct SwapStoreOptions {
  std::vector<std::string> directories;      // one per NVMe drive
  uint64_t stripe_unit_bytes = 1 << 20;      // multiple of alignment(), <= 1 GiB
  uint64_t budget_bytes = kUnlimitedBytes;   // total allocated bytes over all directories
  bool checksums = true;
  DirectMode direct = DirectMode::kRequire;
  DeviceOptions device;
  IoQueueOptions queue;
  uint32_t max_ops = 1024;                   // tickets outstanding at once
  std::optional<FaultConfig> faults;         // wrap the device in a FaultyDevice (tests)
  // Called, under the store's lock, as each read or write finishes (for
  // tracing); it must not call back into the store.
  std::function<void(const SwapRequestRecord&)> on_complete;
};

struct Ticket {
  uint64_t id = 0;
};

struct DirectoryStats {
  std::string path;
  uint64_t file_bytes = 0;     // size of the swap file
  uint64_t bytes_written = 0;  // through to the device (SSD endurance meter)
  uint64_t bytes_read = 0;
};

struct SwapStoreStats {
  uint64_t used_bytes = 0;    // allocated to blobs (padded)
  uint64_t peak_used_bytes = 0;  // the most used_bytes has been
  uint64_t budget_bytes = 0;
  std::vector<DirectoryStats> directories;
};

// Where one stripe unit of a blob lives (for tools and fault tests).
struct PieceLocation {
  uint32_t directory = 0;
  int32_t file_slot = -1;
  uint64_t file_offset_bytes = 0;
  uint64_t blob_offset_bytes = 0;
  uint64_t length_bytes = 0;  // logical bytes
};

class SwapStore {
 public:
  static Result<std::unique_ptr<SwapStore>> open(const SwapStoreOptions& options);
  ~SwapStore();
  SwapStore(const SwapStore&) = delete;
  SwapStore& operator=(const SwapStore&) = delete;

  uint64_t alignment() const { return alignment_; }
  uint64_t padded_size(uint64_t size_bytes) const;
  std::string_view backend() const { return device_->name(); }
  uint64_t stripe_unit_bytes() const { return options_.stripe_unit_bytes; }
  uint32_t queue_depth() const { return device_->queue_depth(); }
  DirectMode direct_mode() const { return options_.direct; }

  // Writes `size_bytes` from `buffer` as blob `name` (created or replaced).
  Result<Ticket> write(const std::string& name, IoBuffer buffer, uint64_t size_bytes);
  // Reads the whole blob into `buffer`.
  Result<Ticket> read(const std::string& name, IoBuffer buffer);
  // Reads at least the blob's first `prefix_bytes` into the same places of
  // `buffer`: the stripe units they touch, whole (each is checked against
  // its checksum), so the buffer holds prefix_bytes rounded up to a stripe
  // unit (or the blob's size, if less) rounded up to the alignment.
  Result<Ticket> read_prefix(const std::string& name, IoBuffer buffer, uint64_t prefix_bytes);
  // Blocks until the operation ends; returns its outcome. Each ticket is waited once.
  Status wait(Ticket ticket);
  // Waits for every outstanding ticket; returns the first error. Not while
  // another thread has tickets of its own in flight.
  Status wait_all();

  // Frees the blob's space. FailedPrecondition while it has I/O in flight.
  Status remove(const std::string& name);
  bool contains(const std::string& name) const;
  Result<uint64_t> blob_size(const std::string& name) const;
  Result<std::vector<PieceLocation>> locate(const std::string& name) const;

  SwapStoreStats stats() const;
  // The fault injector when options.faults was set, else null. Its
  // settings may be changed directly only while no request is in flight;
  // with_faults changes them under the store's lock, beside other threads'
  // requests (false, f not called, without an injector).
  FaultyDevice* faults() { return faulty_.get(); }
  bool with_faults(const std::function<void(FaultyDevice&)>& f);

 private:
  struct Directory {
    std::string path;
    File file;
    int32_t slot = -1;
    uint64_t end_bytes = 0;                 // file size reserved so far
    std::map<uint64_t, uint64_t> free;      // offset -> length, coalesced
    uint64_t bytes_written = 0;
    uint64_t bytes_read = 0;
  };

  struct Blob {
    enum class State { kValid, kWriting, kInvalid };
    struct Extent {
      uint32_t directory;
      uint64_t offset_bytes;
      uint64_t length_bytes;
    };
    struct Piece {
      uint32_t directory;
      uint64_t file_offset_bytes;
      uint64_t blob_offset_bytes;
      uint64_t logical_bytes;
      uint64_t io_bytes;
      uint64_t checksum;
    };
    uint64_t size_bytes = 0;
    std::vector<Extent> extents;
    std::vector<Piece> pieces;
    State state = State::kValid;
    std::string failure;  // why the last write failed
    uint32_t readers = 0;
  };

  struct Op {
    bool active = false;
    bool done = false;
    uint64_t generation = 0;
    IoOp kind = IoOp::kRead;
    // The blob's name (its key in blobs_) and the blob: node-based, so both
    // stay put while the blob exists, and a blob with I/O in flight is not
    // removed — no name copied or looked up per request or per piece.
    const std::string* blob = nullptr;
    Blob* target = nullptr;
    IoBuffer buffer;
    uint32_t remaining = 0;
    uint64_t bytes = 0;
    std::chrono::steady_clock::time_point submitted;
    Status status;
  };

  SwapStore() = default;
  Status open_directories(const SwapStoreOptions& options);
  Status allocate_blob(const std::string& name, Blob& blob, uint64_t size_bytes);
  void free_blob_space(Blob& blob);
  Result<uint64_t> allocate_in(Directory& dir, uint64_t length_bytes);
  void release_in(Directory& dir, uint64_t offset_bytes, uint64_t length_bytes);
  // `what` names the operation in an error; it is called only then (no
  // string is built on the I/O path).
  template <class What>
  Status check_buffer(const What& what, IoBuffer buffer, uint64_t size_bytes) const;
  // `entry`: the blob's element of blobs_.
  Result<uint32_t> new_op(IoOp kind, std::pair<const std::string, Blob>& entry, IoBuffer buffer, uint64_t bytes);
  // Submits the blob's first `count` pieces (all: SIZE_MAX).
  Status submit_pieces(uint32_t op_index, Blob& blob, IoOp kind, size_t count = SIZE_MAX);
  Status pump_results(size_t min_results);
  void on_result(IoResult&& result);
  void finish_op(Op& op);
  Op* find_op(Ticket ticket);
  std::unique_lock<std::mutex> enter() const;
  Status wait_locked(Ticket ticket, std::unique_lock<std::mutex>& lock);
  Ticket make_ticket(uint32_t index) const;

  SwapStoreOptions options_;
  uint64_t alignment_ = 4096;
  uint64_t used_bytes_ = 0;
  uint64_t peak_used_bytes_ = 0;
  uint32_t next_first_dir_ = 0;
  uint64_t next_generation_ = 1;
  std::vector<Directory> dirs_;
  std::unordered_map<std::string, Blob> blobs_;
  std::vector<Op> ops_;
  std::vector<uint32_t> free_ops_;
  std::vector<IoResult> results_;
  // Destroyed in reverse: the queue drains before the devices go.
  std::unique_ptr<BlockDevice> device_;
  std::unique_ptr<FaultyDevice> faulty_;
  std::unique_ptr<IoQueue> queue_;
  mutable std::mutex mu_;
  mutable std::atomic<int> waiting_{0};  // threads waiting to enter
};

}  // namespace strata::io
