#include "io/swap_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <thread>

#include "common/log.h"
#include "common/units.h"

namespace strata::io {

namespace {
// Request tags: op index in the high half, piece index in the low half.
uint64_t make_tag(uint32_t op, uint32_t piece) { return (uint64_t{op} << 32) | piece; }

std::atomic<uint64_t> swap_file_counter{0};

// Tickets: generation above the op index, so a stale ticket is caught.
constexpr uint32_t kOpIndexBits = 20;
constexpr uint64_t kMaxOps = uint64_t{1} << kOpIndexBits;

Result<File> create_swap_file(const std::string& dir, DirectMode direct) {
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) {
    if (errno == ENOENT) return not_found("swap directory " + dir + " does not exist; create it or fix the path");
    return errno_status(errno, "swap directory " + dir);
  }
  if (!S_ISDIR(st.st_mode)) return failed_precondition("swap path " + dir + " is not a directory");
  std::string path = dir + "/strata-swap." + std::to_string(::getpid()) + "." +
                     std::to_string(swap_file_counter.fetch_add(1)) + ".bin";
  STRATA_ASSIGN_OR_RETURN(File file, File::open(path, FileOptions{true, true, direct}));
  // Unlinked at once: the space returns to the filesystem when the store
  // closes or the process dies, and nothing stale is left behind.
  if (::unlink(path.c_str()) != 0) return errno_status(errno, "unlink " + path);
  return file;
}
}  // namespace

Result<std::unique_ptr<SwapStore>> SwapStore::open(const SwapStoreOptions& options) {
  if (options.directories.empty()) return invalid_argument("swap store: no directories given");
  if (options.max_ops == 0 || options.max_ops > kMaxOps) {
    return invalid_argument("swap store: max_ops must be 1.." + std::to_string(kMaxOps));
  }
  std::unique_ptr<SwapStore> store(new SwapStore());
  store->options_ = options;
  STRATA_ASSIGN_OR_RETURN(store->device_, make_block_device(options.device));
  BlockDevice* device = store->device_.get();
  if (options.faults) {
    store->faulty_ = std::make_unique<FaultyDevice>(*store->device_, *options.faults);
    device = store->faulty_.get();
  }
  store->queue_ = std::make_unique<IoQueue>(*device, options.queue);
  STRATA_RETURN_IF_ERROR(store->open_directories(options));
  uint64_t unit = options.stripe_unit_bytes;
  if (unit == 0 || unit > kMaxRequestBytes || !is_aligned(unit, store->alignment_)) {
    return invalid_argument("swap store: stripe unit " + std::to_string(unit) + " bytes must be a multiple of " +
                            std::to_string(store->alignment_) + " and at most " + std::to_string(kMaxRequestBytes));
  }
  store->ops_.resize(options.max_ops);
  for (uint32_t i = options.max_ops; i-- > 0;) store->free_ops_.push_back(i);
  return store;
}

Status SwapStore::open_directories(const SwapStoreOptions& options) {
  dirs_.resize(options.directories.size());
  for (size_t i = 0; i < dirs_.size(); ++i) {
    Directory& d = dirs_[i];
    d.path = options.directories[i];
    STRATA_ASSIGN_OR_RETURN(d.file, create_swap_file(d.path, options.direct));
    alignment_ = std::max(alignment_, d.file.alignment());
    STRATA_ASSIGN_OR_RETURN(d.slot, queue_->attach(d.file.fd(), d.file.path(), d.file.direct() ? d.file.alignment() : 1));
  }
  return ok_status();
}

SwapStore::~SwapStore() {
  if (queue_ == nullptr) return;
  Status status = wait_all();
  if (!status.ok()) log_warning("swap store shutdown: " + status.to_string());
}

uint64_t SwapStore::padded_size(uint64_t size_bytes) const { return round_up(size_bytes, alignment_); }

Result<uint64_t> SwapStore::allocate_in(Directory& dir, uint64_t length_bytes) {
  for (auto it = dir.free.begin(); it != dir.free.end(); ++it) {
    if (it->second < length_bytes) continue;
    uint64_t offset = it->first;
    uint64_t rest = it->second - length_bytes;
    dir.free.erase(it);
    if (rest > 0) dir.free.emplace(offset + length_bytes, rest);
    return offset;
  }
  uint64_t offset = dir.end_bytes;
  STRATA_RETURN_IF_ERROR(dir.file.allocate(offset, length_bytes));
  dir.end_bytes += length_bytes;
  return offset;
}

void SwapStore::release_in(Directory& dir, uint64_t offset_bytes, uint64_t length_bytes) {
  auto [it, inserted] = dir.free.emplace(offset_bytes, length_bytes);
  STRATA_CHECK_MSG(inserted, "double free of swap extent at %llu", static_cast<unsigned long long>(offset_bytes));
  auto next = std::next(it);
  if (next != dir.free.end() && it->first + it->second == next->first) {
    it->second += next->second;
    dir.free.erase(next);
  }
  if (it != dir.free.begin()) {
    auto prev = std::prev(it);
    if (prev->first + prev->second == it->first) {
      prev->second += it->second;
      dir.free.erase(it);
    }
  }
}

void SwapStore::free_blob_space(Blob& blob) {
  for (const Blob::Extent& e : blob.extents) {
    release_in(dirs_[e.directory], e.offset_bytes, e.length_bytes);
    used_bytes_ -= e.length_bytes;
  }
  blob.extents.clear();
  blob.pieces.clear();
}

Status SwapStore::allocate_blob(const std::string& name, Blob& blob, uint64_t size_bytes) {
  uint64_t unit = options_.stripe_unit_bytes;
  uint32_t ndirs = static_cast<uint32_t>(dirs_.size());
  uint64_t nunits = div_ceil(size_bytes, unit);
  uint32_t first = next_first_dir_;
  next_first_dir_ = (next_first_dir_ + 1) % ndirs;
  std::vector<uint64_t> per_dir(ndirs, 0);
  std::vector<Blob::Piece> pieces;
  pieces.reserve(nunits);
  for (uint64_t k = 0; k < nunits; ++k) {
    uint32_t d = static_cast<uint32_t>((first + k) % ndirs);
    uint64_t begin = k * unit;
    uint64_t logical = std::min(unit, size_bytes - begin);
    uint64_t io = padded_size(logical);
    pieces.push_back({d, per_dir[d], begin, logical, io, 0});
    per_dir[d] += io;
  }
  uint64_t total = 0;
  for (uint64_t b : per_dir) total += b;
  if (options_.budget_bytes != kUnlimitedBytes && used_bytes_ + total > options_.budget_bytes) {
    return resource_exhausted("swap budget of " + format_bytes(options_.budget_bytes) + " exceeded: blob '" + name +
                              "' needs " + format_bytes(total) + " with " + format_bytes(used_bytes_) +
                              " in use; raise the NVMe budget or free blobs");
  }
  std::vector<Blob::Extent> extents;
  for (uint32_t d = 0; d < ndirs; ++d) {
    if (per_dir[d] == 0) continue;
    Result<uint64_t> offset = allocate_in(dirs_[d], per_dir[d]);
    if (!offset) {
      for (const Blob::Extent& e : extents) release_in(dirs_[e.directory], e.offset_bytes, e.length_bytes);
      return std::move(offset).error().with_context("swap blob '" + name + "'");
    }
    extents.push_back({d, *offset, per_dir[d]});
  }
  for (Blob::Piece& p : pieces) {
    auto e = std::find_if(extents.begin(), extents.end(), [&](const Blob::Extent& x) { return x.directory == p.directory; });
    p.file_offset_bytes += e->offset_bytes;
  }
  used_bytes_ += total;
  peak_used_bytes_ = std::max(peak_used_bytes_, used_bytes_);
  blob.size_bytes = size_bytes;
  blob.extents = std::move(extents);
  blob.pieces = std::move(pieces);
  return ok_status();
}

template <class What>
Status SwapStore::check_buffer(const What& what, IoBuffer buffer, uint64_t size_bytes) const {
  uint64_t needed = padded_size(size_bytes);
  if (buffer.capacity_bytes < needed) {
    return invalid_argument(what() + ": buffer of " + std::to_string(buffer.capacity_bytes) +
                            " bytes is smaller than " + std::to_string(needed) + " (size rounded up to the " +
                            std::to_string(alignment_) + "-byte I/O alignment)");
  }
  if (size_bytes > 0 && !is_aligned(buffer.data, alignment_)) {
    return invalid_argument(what() + ": buffer address is not " + std::to_string(alignment_) +
                            "-byte aligned, as direct I/O requires");
  }
  return ok_status();
}

Result<uint32_t> SwapStore::new_op(IoOp kind, std::pair<const std::string, Blob>& entry, IoBuffer buffer,
                                   uint64_t bytes) {
  if (free_ops_.empty()) {
    return resource_exhausted("swap store: " + std::to_string(options_.max_ops) +
                              " operations outstanding (the maximum); wait for some first");
  }
  uint32_t index = free_ops_.back();
  free_ops_.pop_back();
  Op& op = ops_[index];
  op = Op{};
  op.active = true;
  op.generation = next_generation_++;
  op.kind = kind;
  op.blob = &entry.first;
  op.target = &entry.second;
  op.buffer = buffer;
  op.bytes = bytes;
  op.submitted = std::chrono::steady_clock::now();
  return index;
}

Status SwapStore::submit_pieces(uint32_t op_index, Blob& blob, IoOp kind, size_t count) {
  Op& op = ops_[op_index];
  for (size_t i = 0; i < std::min(count, blob.pieces.size()); ++i) {
    const Blob::Piece& p = blob.pieces[i];
    IoRequest request{kind, dirs_[p.directory].slot, p.file_offset_bytes, op.buffer.data + p.blob_offset_bytes,
                      p.io_bytes, make_tag(op_index, static_cast<uint32_t>(i))};
    Status status = queue_->submit(request);
    // A full queue makes room by finishing earlier requests.
    while (status.code() == StatusCode::kResourceExhausted && queue_->outstanding() > 0) {
      STRATA_RETURN_IF_ERROR(pump_results(1));
      status = queue_->submit(request);
    }
    if (!status.ok()) {
      if (op.status.ok()) op.status = std::move(status);
      break;
    }
    ++op.remaining;
  }
  if (op.remaining == 0) finish_op(op);
  return ok_status();
}

Result<Ticket> SwapStore::write(const std::string& name, IoBuffer buffer, uint64_t size_bytes) {
  std::unique_lock lock = enter();
  auto what = [&] { return "write swap blob '" + name + "' (" + format_bytes(size_bytes) + ")"; };
  if (name.empty()) return invalid_argument("write swap blob: empty name");
  STRATA_RETURN_IF_ERROR(check_buffer(what, buffer, size_bytes));
  auto it = blobs_.find(name);
  if (it != blobs_.end() && (it->second.state == Blob::State::kWriting || it->second.readers > 0)) {
    return failed_precondition(what() + ": the blob has I/O in flight");
  }
  if (free_ops_.empty()) {
    return resource_exhausted(what() + ": " + std::to_string(options_.max_ops) +
                              " operations outstanding (the maximum); wait for some first");
  }
  auto entry = blobs_.try_emplace(name).first;
  Blob& blob = entry->second;
  if (blob.size_bytes != size_bytes || (blob.pieces.empty() && size_bytes > 0)) {
    free_blob_space(blob);
    Status status = allocate_blob(name, blob, size_bytes);
    if (!status.ok()) {
      blobs_.erase(entry);
      return status;
    }
  }
  if (options_.checksums) {
    for (Blob::Piece& p : blob.pieces) p.checksum = XXH3_64bits(buffer.data + p.blob_offset_bytes, p.logical_bytes);
  }
  STRATA_ASSIGN_OR_RETURN(uint32_t index, new_op(IoOp::kWrite, *entry, buffer, size_bytes));
  blob.state = Blob::State::kWriting;
  blob.failure.clear();
  Ticket ticket = make_ticket(index);
  STRATA_RETURN_IF_ERROR(submit_pieces(index, blob, IoOp::kWrite));
  return ticket;
}

Result<Ticket> SwapStore::read(const std::string& name, IoBuffer buffer) {
  return read_prefix(name, buffer, UINT64_MAX);
}

Result<Ticket> SwapStore::read_prefix(const std::string& name, IoBuffer buffer, uint64_t prefix_bytes) {
  std::unique_lock lock = enter();
  auto it = blobs_.find(name);
  if (it == blobs_.end()) return not_found("read swap blob '" + name + "': no such blob");
  Blob& blob = it->second;
  auto what = [&] { return "read swap blob '" + name + "' (" + format_bytes(blob.size_bytes) + ")"; };
  if (blob.state == Blob::State::kWriting) return failed_precondition(what() + ": a write to it is in flight");
  if (blob.state == Blob::State::kInvalid) {
    return data_loss(what() + ": its last write failed, so it holds no valid data (" + blob.failure + ")");
  }
  // The pieces (stripe units, in blob order) that hold the prefix, and the
  // logical bytes they cover.
  const uint64_t wanted = std::min(prefix_bytes, blob.size_bytes);
  size_t count = 0;
  uint64_t covered = 0;
  while (count < blob.pieces.size() && covered < wanted) {
    covered = blob.pieces[count].blob_offset_bytes + blob.pieces[count].logical_bytes;
    ++count;
  }
  if (count == blob.pieces.size()) covered = blob.size_bytes;
  STRATA_RETURN_IF_ERROR(check_buffer(
      [&] { return what() + (covered < blob.size_bytes ? " up to byte " + std::to_string(covered) : std::string()); },
      buffer, covered));
  STRATA_ASSIGN_OR_RETURN(uint32_t index, new_op(IoOp::kRead, *it, buffer, covered));
  ++blob.readers;
  Ticket ticket = make_ticket(index);
  STRATA_RETURN_IF_ERROR(submit_pieces(index, blob, IoOp::kRead, count));
  return ticket;
}

void SwapStore::on_result(IoResult&& result) {
  uint32_t index = static_cast<uint32_t>(result.tag >> 32);
  uint32_t piece = static_cast<uint32_t>(result.tag & 0xffffffffu);
  STRATA_CHECK(index < ops_.size() && ops_[index].active && ops_[index].remaining > 0);
  Op& op = ops_[index];
  const Blob::Piece& p = op.target->pieces.at(piece);
  if (result.status.ok()) {
    Directory& d = dirs_[p.directory];
    (op.kind == IoOp::kWrite ? d.bytes_written : d.bytes_read) += p.io_bytes;
    if (op.kind == IoOp::kRead && options_.checksums && op.status.ok()) {
      uint64_t sum = XXH3_64bits(op.buffer.data + p.blob_offset_bytes, p.logical_bytes);
      if (sum != p.checksum) {
        op.status =
            data_loss("checksum mismatch in swap blob '" + *op.blob + "' bytes " + std::to_string(p.blob_offset_bytes) +
                      ".." + std::to_string(p.blob_offset_bytes + p.logical_bytes) + " (" + d.file.path() + " offset " +
                      std::to_string(p.file_offset_bytes) +
                      "): the data read back is not what "
                      "was written");
      }
    }
  } else if (op.status.ok()) {
    op.status = std::move(result.status).with_context("swap blob '" + *op.blob + "'");
  }
  if (--op.remaining == 0) finish_op(op);
}

void SwapStore::finish_op(Op& op) {
  op.done = true;
  if (options_.on_complete) {
    options_.on_complete(
        SwapRequestRecord{op.kind, op.blob, op.bytes, op.submitted, std::chrono::steady_clock::now(), op.status.ok()});
  }
  Blob& blob = *op.target;
  if (op.kind == IoOp::kRead) {
    --blob.readers;
  } else if (op.status.ok()) {
    blob.state = Blob::State::kValid;
  } else {
    blob.state = Blob::State::kInvalid;
    blob.failure = op.status.to_string();
  }
}

Status SwapStore::pump_results(size_t min_results) {
  results_.clear();
  STRATA_ASSIGN_OR_RETURN(size_t n, queue_->wait(min_results, results_));
  (void)n;
  for (IoResult& r : results_) on_result(std::move(r));
  return ok_status();
}

Ticket SwapStore::make_ticket(uint32_t index) const {
  return Ticket{(ops_[index].generation << kOpIndexBits) | index};
}

SwapStore::Op* SwapStore::find_op(Ticket ticket) {
  uint64_t index = ticket.id & (kMaxOps - 1);
  if (index >= ops_.size()) return nullptr;
  Op& op = ops_[index];
  if (!op.active || op.generation != (ticket.id >> kOpIndexBits)) return nullptr;
  return &op;
}

std::unique_lock<std::mutex> SwapStore::enter() const {
  waiting_.fetch_add(1);
  std::unique_lock lock(mu_);
  waiting_.fetch_sub(1);
  return lock;
}

Status SwapStore::wait(Ticket ticket) {
  std::unique_lock lock = enter();
  return wait_locked(ticket, lock);
}

Status SwapStore::wait_locked(Ticket ticket, std::unique_lock<std::mutex>& lock) {
  STRATA_CHECK_MSG(find_op(ticket) != nullptr, "swap store: wait on an unknown or already-waited ticket");
  for (;;) {
    Op* op = find_op(ticket);
    if (op->done) break;
    STRATA_RETURN_IF_ERROR(pump_results(1));
    // Another thread wants the store: let it in between completions (it
    // may reap ours; the op table is re-read after).
    if (waiting_.load() > 0) {
      lock.unlock();
      while (waiting_.load() > 0) std::this_thread::yield();
      lock = enter();
    }
  }
  Op* op = find_op(ticket);
  Status status = std::move(op->status);
  op->active = false;
  free_ops_.push_back(static_cast<uint32_t>(op - ops_.data()));
  return status;
}

Status SwapStore::wait_all() {
  std::unique_lock lock = enter();
  std::vector<Ticket> tickets;
  for (uint32_t i = 0; i < ops_.size(); ++i) {
    if (ops_[i].active) tickets.push_back(make_ticket(i));
  }
  Status first;
  for (Ticket t : tickets) {
    Status status = wait_locked(t, lock);
    if (first.ok() && !status.ok()) first = std::move(status);
  }
  return first;
}

Status SwapStore::remove(const std::string& name) {
  std::unique_lock lock = enter();
  auto it = blobs_.find(name);
  if (it == blobs_.end()) return not_found("remove swap blob '" + name + "': no such blob");
  if (it->second.state == Blob::State::kWriting || it->second.readers > 0) {
    return failed_precondition("remove swap blob '" + name + "': the blob has I/O in flight");
  }
  free_blob_space(it->second);
  blobs_.erase(it);
  return ok_status();
}

bool SwapStore::contains(const std::string& name) const {
  std::unique_lock lock = enter();
  return blobs_.count(name) != 0;
}

Result<uint64_t> SwapStore::blob_size(const std::string& name) const {
  std::unique_lock lock = enter();
  auto it = blobs_.find(name);
  if (it == blobs_.end()) return not_found("swap blob '" + name + "': no such blob");
  return it->second.size_bytes;
}

Result<std::vector<PieceLocation>> SwapStore::locate(const std::string& name) const {
  std::unique_lock lock = enter();
  auto it = blobs_.find(name);
  if (it == blobs_.end()) return not_found("swap blob '" + name + "': no such blob");
  std::vector<PieceLocation> out;
  for (const Blob::Piece& p : it->second.pieces) {
    out.push_back({p.directory, dirs_[p.directory].slot, p.file_offset_bytes, p.blob_offset_bytes, p.logical_bytes});
  }
  return out;
}

bool SwapStore::with_faults(const std::function<void(FaultyDevice&)>& f) {
  if (!faulty_) return false;
  std::unique_lock<std::mutex> lock = enter();
  f(*faulty_);
  return true;
}

SwapStoreStats SwapStore::stats() const {
  std::unique_lock lock = enter();
  SwapStoreStats s;
  s.used_bytes = used_bytes_;
  s.peak_used_bytes = peak_used_bytes_;
  s.budget_bytes = options_.budget_bytes;
  for (const Directory& d : dirs_) s.directories.push_back({d.path, d.end_bytes, d.bytes_written, d.bytes_read});
  return s;
}

}  // namespace strata::io
