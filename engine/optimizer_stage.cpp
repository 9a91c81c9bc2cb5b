#include "engine/optimizer_stage.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstring>
#include <deque>
#include <optional>

#include "common/thread.h"
#include "common/units.h"
#include "cpu_optim/executor.h"

namespace strata::engine {

StateLayout StateLayout::of(int64_t elems, cpu_optim::StateType type) {
  auto line = [](uint64_t b) { return (b + 63) / 64 * 64; };
  const uint64_t n = static_cast<uint64_t>(elems);
  const bool q8 = type == cpu_optim::StateType::kQ8;
  // 8-bit arrays: n codes, then the scales (cpu_optim::state_array_bytes counts both).
  const uint64_t values = q8 ? n : cpu_optim::state_array_bytes(type, elems);
  const uint64_t scales = q8 ? cpu_optim::state_array_bytes(type, elems) - n : 0;
  StateLayout l;
  l.m = line(4 * n);
  l.m_scale = l.m + line(values);
  l.v = l.m_scale + line(scales);
  l.v_scale = l.v + line(values);
  l.bytes = l.v_scale + line(scales);
  if (!q8) l.m_scale = l.v_scale = 0;
  l.scales = static_cast<int64_t>(scales / 4);
  return l;
}

std::string OptimizerStage::piece_name(size_t piece) const {
  const Piece& p = pieces_[piece];
  return "chunk-" + std::to_string(p.chunk) + (pieces_of(p.chunk) == 1 ? "" : "-piece-" + std::to_string(p.index));
}

Result<std::unique_ptr<OptimizerStage>> OptimizerStage::create(std::vector<int64_t> chunk_elems, Tier tier,
                                                               io::SwapStore* swap, PinnedArena* staging,
                                                               cpu_optim::Executor& executor, Trace* trace,
                                                               cpu_optim::StateType states, int64_t piece_elems) {
  if (chunk_elems.empty()) return invalid_argument("optimizer stage: no chunks");
  if (tier == Tier::kDevice) return invalid_argument("optimizer stage: states live on the host or NVMe");
  STRATA_RETURN_IF_ERROR(check_state_piece_elems(piece_elems).with_context("optimizer stage"));
  if (tier != Tier::kNvme) piece_elems = 0;  // in RAM a chunk is updated in place, whole
  const int64_t max_elems = max_state_piece(chunk_elems, piece_elems);
  if (tier == Tier::kNvme) {
    if (swap == nullptr || staging == nullptr) {
      return invalid_argument("optimizer stage: states on NVMe need a swap store and a staging arena");
    }
    // A chunk in pieces has its weights read piece by piece into one buffer,
    // each at a multiple of 2 * kStatePieceGranule bytes.
    const bool split = max_elems < *std::max_element(chunk_elems.begin(), chunk_elems.end());
    if (split && 2 * static_cast<uint64_t>(kStatePieceGranule) % swap->alignment() != 0) {
      return invalid_argument("optimizer stage: the swap store's alignment " + std::to_string(swap->alignment()) +
                              " does not divide a piece's weights boundary; use pieces of 0 (whole chunks)");
    }
    uint64_t need = swap->padded_size(state_bytes(max_elems, states));
    if (staging->capacity() < 3 || staging->buffer_bytes() < need) {
      return invalid_argument("optimizer stage: the staging arena needs 3 buffers of " + format_bytes(need) +
                              " (has " + std::to_string(staging->capacity()) + " of " +
                              format_bytes(staging->buffer_bytes()) + ")");
    }
  }
  std::unique_ptr<OptimizerStage> stage(new OptimizerStage());
  stage->elems_ = std::move(chunk_elems);
  for (size_t c = 0; c < stage->elems_.size(); ++c) {
    stage->first_piece_.push_back(stage->pieces_.size());
    int64_t offset = 0;
    for (int64_t n : state_piece_sizes(stage->elems_[c], piece_elems)) {
      stage->pieces_.push_back({c, stage->pieces_.size() - stage->first_piece_.back(), offset, n});
      offset += n;
    }
  }
  stage->first_piece_.push_back(stage->pieces_.size());
  stage->tier_ = tier;
  stage->swap_ = swap;
  stage->staging_ = staging;
  stage->executor_ = &executor;
  stage->trace_ = trace;
  stage->state_type_ = states;
  if (tier == Tier::kHost) stage->host_.resize(stage->pieces_.size());
  stage->gen_.assign(stage->pieces_.size(), 0);
  for (size_t u = 0; u < stage->pieces_.size(); ++u) {
    const std::string name = stage->piece_name(u);
    stage->names_.push_back({"optimizer-state/" + name, "optimizer-state/" + name + ".b", "weights/" + name,
                             "weights/" + name + ".b", "gradient/" + name});
  }
  return stage;
}

OptimizerStage::~OptimizerStage() {
  cancel();
  if (worker_.joinable()) {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    worker_.join();
  }
}

void OptimizerStage::worker_loop() {
  name_this_thread("strata:optim");
  std::unique_lock lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return job_ || stop_; });
    if (!job_) return;  // stopping
    job_ = false;
    lock.unlock();
    Status s = run_overlap();
    lock.lock();
    worker_status_ = std::move(s);
    job_done_ = true;
    cv_.notify_all();
  }
}

// Whether a view may be homed on NVMe beside the states, with the staging
// buffers holding it (and whatever else is homed there): `what` is
// "weights" or "gradients".
Status OptimizerStage::check_nvme_home(const char* what, bool weights, uint64_t gradient_bytes) const {
  if (tier_ != Tier::kNvme) {
    return invalid_argument("optimizer stage: " + std::string(what) + " on NVMe need the states on NVMe");
  }
  int64_t max_elems = 0;
  for (const Piece& p : pieces_) max_elems = std::max(max_elems, p.elems);
  const uint64_t need = staging_bytes(*swap_, max_elems, state_type_, weights, gradient_bytes);
  if (staging_->buffer_bytes() < need) {
    return invalid_argument("optimizer stage: " + std::string(what) + " on NVMe need staging buffers of " +
                            format_bytes(need) + " (have " + format_bytes(staging_->buffer_bytes()) + ")");
  }
  return ok_status();
}

Status OptimizerStage::home_weights_on_nvme(DType dtype) {
  if (dtype != DType::kBF16 && dtype != DType::kF16) {
    return invalid_argument("optimizer stage: working weights on NVMe are bf16 or fp16");
  }
  STRATA_RETURN_IF_ERROR(
      check_nvme_home("weights", /*weights=*/true, grads_nvme_ ? dtype_bytes(grads_dtype_) : 0));
  weights_nvme_ = true;
  weights_dtype_ = dtype;
  return ok_status();
}

Status OptimizerStage::home_gradients_on_nvme(DType dtype) {
  if (dtype != DType::kBF16 && dtype != DType::kF16 && dtype != DType::kF32) {
    return invalid_argument("optimizer stage: gradients on NVMe are bf16, fp16 or fp32 sums");
  }
  STRATA_RETURN_IF_ERROR(check_nvme_home("gradients", weights_nvme_, dtype_bytes(dtype)));
  grads_nvme_ = true;
  grads_dtype_ = dtype;
  grad_writes_.assign(pieces_.size(), std::nullopt);
  return ok_status();
}

Status OptimizerStage::wait_gradients_released(size_t count) {
  std::unique_lock lock(mu_);
  cv_.wait(lock, [&] { return released_ >= count || job_done_ || abort_; });
  if (released_ >= count) return ok_status();
  if (!worker_status_.ok()) return worker_status_;
  return cancelled("optimizer stage: the step ended before the gradient buffers of " + std::to_string(count) +
                   " chunks were free again");
}

Status OptimizerStage::write_gradient(size_t c) {
  const auto* base = static_cast<const std::byte*>(ov_.grads[c].data);
  for (size_t u = first_piece_[c]; u < first_piece_[c + 1]; ++u) {
    const uint64_t bytes = gradient_bytes(u);
    // The swap store reads the padding past the piece's bytes too (the
    // caller's buffer holds the chunk padded); pieces start on its alignment.
    const uint64_t at = dtype_bytes(grads_dtype_) * static_cast<uint64_t>(pieces_[u].offset);
    io::IoBuffer buf{const_cast<std::byte*>(base) + at, swap_->padded_size(bytes)};
    Result<io::Ticket> t = swap_->write(gradient_blob(u), buf, bytes);
    if (!t) return std::move(t).error().with_context("writing the gradient of chunk " + std::to_string(c));
    grad_writes_[u] = *t;
    outcome_.counters.nvme_bytes_written += bytes;
  }
  return ok_status();
}

Status OptimizerStage::wait_gradient_writes(size_t first, size_t end) {
  Status s = ok_status();
  for (size_t u = first; u < end; ++u) {
    if (!grad_writes_[u]) continue;
    Status w = swap_->wait(*grad_writes_[u]);
    grad_writes_[u].reset();
    if (s.ok() && !w.ok()) {
      s = std::move(w).with_context("writing the gradient of chunk " + std::to_string(pieces_[u].chunk));
    }
  }
  return s;
}

Status OptimizerStage::release_gradient(size_t c) {
  STRATA_RETURN_IF_ERROR(wait_gradient_writes(first_piece_[c], first_piece_[c + 1]));
  {
    std::lock_guard lock(mu_);
    ++released_;
  }
  cv_.notify_all();
  return ok_status();
}

Status OptimizerStage::enable_ram_speculation() {
  if (tier_ != Tier::kHost) return failed_precondition("optimizer stage: RAM speculation is for states in RAM");
  next_.resize(pieces_.size());
  for (size_t u = 0; u < pieces_.size(); ++u) {
    next_[u] = AlignedVector<std::byte>(state_bytes(pieces_[u].elems, state_type_));
    executor_->zero(next_[u].data(), next_[u].size());
  }
  return ok_status();
}

void OptimizerStage::set_store(ChunkStore* store) {
  store_ = store;
  if (store_ == nullptr) return;
  for (size_t c = 0; c < elems_.size(); ++c) store_->set_state_pieces(c, pieces_of(c));
}

std::vector<ChunkStore::BlobPiece> OptimizerStage::weights_blobs(size_t chunk) const {
  STRATA_CHECK(chunk < elems_.size() && weights_nvme_);
  std::vector<ChunkStore::BlobPiece> blobs;
  for (size_t u = first_piece_[chunk]; u < first_piece_[chunk + 1]; ++u) {
    blobs.push_back({weights_blob(u, gen_[u]), 2 * static_cast<uint64_t>(pieces_[u].offset)});
  }
  return blobs;
}

std::vector<OptimizerStage::Slice> OptimizerStage::slices(size_t piece) const {
  const Piece& p = pieces_[piece];
  const StateLayout l = StateLayout::of(p.elems, state_type_);
  const uint64_t off = static_cast<uint64_t>(p.offset), n = static_cast<uint64_t>(p.elems);
  const uint64_t eb = cpu_optim::state_elem_bytes(state_type_);
  std::vector<Slice> out = {{0, 4 * off, 0, 4 * n}, {1, eb * off, l.m, eb * n}, {2, eb * off, l.v, eb * n}};
  if (l.scales > 0) {  // pieces start on whole 8-bit blocks
    const uint64_t block = off / static_cast<uint64_t>(cpu_optim::kQ8BlockElems);
    const uint64_t bytes = 4 * static_cast<uint64_t>(l.scales);
    out.push_back({3, 4 * block, l.m_scale, bytes});
    out.push_back({4, 4 * block, l.v_scale, bytes});
  }
  return out;
}

Result<PinnedArena::Lease> OptimizerStage::read_staged(const std::string& name, const std::string& what,
                                                       uint64_t prefix_bytes) {
  STRATA_ASSIGN_OR_RETURN(PinnedArena::Lease lease, staging_->acquire("read " + name));
  STRATA_ASSIGN_OR_RETURN(io::Ticket t, swap_->read_prefix(name, lease.buffer(), prefix_bytes));
  STRATA_RETURN_IF_ERROR(swap_->wait(t).with_context("reading " + what));
  return lease;
}

Status OptimizerStage::write_staged(const std::string& name, uint64_t bytes, const Fill& fill,
                                    const std::string& what) {
  STRATA_ASSIGN_OR_RETURN(StagedRequest w, submit_staged(name, bytes, fill, what));
  return swap_->wait(w.ticket).with_context("writing " + what);
}

Result<OptimizerStage::StagedRequest> OptimizerStage::submit_staged(const std::string& name, uint64_t bytes,
                                                                  const Fill& fill, std::string what) {
  STRATA_ASSIGN_OR_RETURN(PinnedArena::Lease lease, staging_->acquire("write " + name));
  // The arrays' padding and the alignment tail are written too.
  executor_->zero(lease.data(), lease.buffer().capacity_bytes);
  STRATA_RETURN_IF_ERROR(fill(lease.data()));
  STRATA_ASSIGN_OR_RETURN(io::Ticket t, swap_->write(name, lease.buffer(), bytes));
  return StagedRequest{t, std::move(lease), std::move(what)};
}

void OptimizerStage::initialize_in_ram(size_t c, const float* master) {
  for (size_t u = first_piece_[c]; u < first_piece_[c + 1]; ++u) {
    // Filled on the executor's threads: they fault the pages in. m = v = 0
    // (8-bit states: zero codes under zero scales decode to 0).
    const int64_t n = pieces_[u].elems;
    const uint64_t bytes = state_bytes(n, state_type_), master_bytes = static_cast<uint64_t>(n) * 4;
    host_[u] = AlignedVector<std::byte>(bytes);
    executor_->copy(host_[u].data(), master + pieces_[u].offset, master_bytes);
    executor_->zero(host_[u].data() + master_bytes, bytes - master_bytes);
  }
}

Status OptimizerStage::initial_writes(size_t c, const float* master, const InitialWrite& write) {
  const std::string what = "chunk " + std::to_string(c);
  for (size_t u = first_piece_[c]; u < first_piece_[c + 1]; ++u) {
    const int64_t n = pieces_[u].elems;
    const float* src = master + pieces_[u].offset;
    // m = v = 0: the staging buffer comes zeroed.
    auto put_master = [this, src, n](std::byte* state) {
      executor_->copy(state, src, static_cast<uint64_t>(n) * 4);
      return ok_status();
    };
    STRATA_RETURN_IF_ERROR(
        write(blob(u, gen_[u]), state_bytes(n, state_type_), put_master, "optimizer state of " + what));
    if (!weights_nvme_) continue;
    auto put_weights = [this, src, n](std::byte* w) {
      return cpu_optim::convert(src, DType::kF32, w, weights_dtype_, n, *executor_);
    };
    STRATA_RETURN_IF_ERROR(
        write(weights_blob(u, gen_[u]), 2 * static_cast<uint64_t>(n), put_weights, "the weights of " + what));
  }
  return ok_status();
}

Status OptimizerStage::initialize(size_t c, const float* master) {
  STRATA_CHECK(c < elems_.size());
  if (tier_ == Tier::kHost) {
    initialize_in_ram(c, master);
    return ok_status();
  }
  return initial_writes(c, master,
                        [this](const std::string& name, uint64_t bytes, const Fill& fill, const std::string& what) {
                          return write_staged(name, bytes, fill, what);
                        });
}

void OptimizerStage::leave_unset() {
  if (tier_ != Tier::kHost) return;
  for (size_t u = 0; u < pieces_.size(); ++u) {
    // Zeroed on the executor's threads, which fault the pages in (the
    // load's reads into them are one thread's).
    host_[u] = AlignedVector<std::byte>(state_bytes(pieces_[u].elems, state_type_));
    executor_->zero(host_[u].data(), host_[u].size());
  }
}

// Staged requests in flight, oldest first, at most the staging buffers but
// one (so that a blocking read or write still finds a buffer): each keeps
// the lease of its buffer until it has been waited for, on every path,
// errors too — a buffer in flight is a DMA target. The destructor waits for
// what is left, its errors dropped (the caller reports the first it saw).
class OptimizerStage::InFlight {
 public:
  InFlight(io::SwapStore* swap, const PinnedArena* staging, const char* verb)
      : swap_(swap), most_(std::max<uint32_t>(staging != nullptr ? staging->capacity() : 1, 2) - 1), verb_(verb) {}
  InFlight(const InFlight&) = delete;
  InFlight& operator=(const InFlight&) = delete;
  ~InFlight() { drain().ignore(); }

  bool full() const { return q_.size() >= most_; }
  bool empty() const { return q_.empty(); }
  void push(StagedRequest r) { q_.push_back(std::move(r)); }
  // Waits for the oldest; its buffer's lease goes to `lease` (or back to
  // the arena).
  Status retire(PinnedArena::Lease* lease = nullptr) {
    StagedRequest r = std::move(q_.front());
    q_.pop_front();
    Status s = swap_->wait(r.ticket).with_context(verb_ + r.what);
    if (lease != nullptr) *lease = std::move(r.lease);
    return s;
  }
  // Waits for every one; the first error.
  Status drain() {
    Status first = ok_status();
    while (!q_.empty()) {
      Status s = retire();
      if (first.ok() && !s.ok()) first = std::move(s);
    }
    return first;
  }

 private:
  io::SwapStore* swap_;
  size_t most_;
  std::string verb_;
  std::deque<StagedRequest> q_;
};

Status OptimizerStage::initialize_all(const MasterSource& master) {
  InFlight in_flight(swap_, staging_, "writing ");
  Status first_error = ok_status();
  auto keep = [&](Status s) {
    if (first_error.ok() && !s.ok()) first_error = std::move(s);
  };
  auto write_behind = [&](const std::string& name, uint64_t bytes, const Fill& fill, const std::string& what) {
    if (in_flight.full()) keep(in_flight.retire());
    if (!first_error.ok()) return first_error;
    STRATA_ASSIGN_OR_RETURN(StagedRequest w, submit_staged(name, bytes, fill, what));
    in_flight.push(std::move(w));
    return ok_status();
  };
  for (size_t c = 0; c < elems_.size() && first_error.ok(); ++c) {
    Result<const float*> m = master(c);
    if (!m) {
      first_error = m.error();
      break;
    }
    if (tier_ == Tier::kHost) {
      initialize_in_ram(c, *m);
      continue;
    }
    keep(initial_writes(c, *m, write_behind));
  }
  keep(in_flight.drain());
  return first_error;
}

Status OptimizerStage::visit_weights(size_t c, const WeightsSlice& slice) {
  STRATA_CHECK(c < elems_.size() && weights_nvme_);
  for (size_t u = first_piece_[c]; u < first_piece_[c + 1]; ++u) {
    STRATA_ASSIGN_OR_RETURN(PinnedArena::Lease lease,
                            read_staged(weights_blob(u, gen_[u]), "the weights of chunk " + std::to_string(c)));
    STRATA_RETURN_IF_ERROR(slice(pieces_[u].offset, {lease.data(), 2 * static_cast<size_t>(pieces_[u].elems)}));
  }
  return ok_status();
}

Status OptimizerStage::replace_weights(size_t c, const WeightsSlice& slice) {
  STRATA_CHECK(c < elems_.size() && weights_nvme_);
  for (size_t u = first_piece_[c]; u < first_piece_[c + 1]; ++u) {
    const uint64_t bytes = 2 * static_cast<uint64_t>(pieces_[u].elems);
    auto fill = [&](std::byte* w) { return slice(pieces_[u].offset, {w, static_cast<size_t>(bytes)}); };
    STRATA_RETURN_IF_ERROR(write_staged(weights_blob(u, gen_[u]), bytes, fill, "the weights of chunk " + std::to_string(c)));
  }
  return ok_status();
}

Status OptimizerStage::read_master(size_t c, float* dst) {
  return visit_state(
      c,
      [&](int, uint64_t offset, std::span<std::byte> bytes) {
        std::memcpy(reinterpret_cast<std::byte*>(dst) + offset, bytes.data(), bytes.size());
        return ok_status();
      },
      kMasterOnly);
}

Status OptimizerStage::weights_from_master(size_t c, void* dst, DType dtype) {
  auto* out = static_cast<std::byte*>(dst);
  const uint64_t es = dtype_bytes(dtype);
  return visit_state(
      c,
      [&](int, uint64_t offset, std::span<std::byte> bytes) {
        // The master weights (the only part visited): fp32, from element offset / 4.
        return cpu_optim::convert(bytes.data(), DType::kF32, out + offset / 4 * es, dtype,
                                  static_cast<int64_t>(bytes.size() / 4));
      },
      kMasterOnly);
}

Status OptimizerStage::restore_stale_weights(std::vector<bool>* stale, const std::vector<void*>& weights, DType dtype,
                                             bool mark_written) {
  if (mark_written) {
    for (size_t c = 0; c < written_.size() && c < stale->size(); ++c) (*stale)[c] = (*stale)[c] || written_[c];
  }
  for (size_t c = 0; c < stale->size(); ++c) {
    if (!(*stale)[c]) continue;
    STRATA_RETURN_IF_ERROR(weights_from_master(c, weights.at(c), dtype)
                               .with_context("putting back the weights of chunk " + std::to_string(c) +
                                             " after a failed or skipped step"));
    (*stale)[c] = false;
  }
  return ok_status();
}

Status OptimizerStage::visit_state(size_t c, const StateSlice& slice, int parts) {
  STRATA_CHECK(c < elems_.size());
  auto wanted_of = [&](size_t u) {
    std::vector<Slice> wanted = slices(u);
    std::erase_if(wanted, [&](const Slice& s) { return s.part >= parts; });
    return wanted;
  };
  if (tier_ == Tier::kHost) {
    for (size_t u = first_piece_[c]; u < first_piece_[c + 1]; ++u) {
      STRATA_CHECK_MSG(!host_[u].empty(), "optimizer stage: chunk %zu was never initialised", c);
      for (const Slice& s : wanted_of(u)) {
        STRATA_RETURN_IF_ERROR(slice(s.part, s.offset, {host_[u].data() + s.at, static_cast<size_t>(s.bytes)}));
      }
    }
    return ok_status();
  }
  // On NVMe the next pieces' reads are in flight while `slice` takes this
  // one's bytes (a checkpoint writes them meanwhile); every read is waited
  // for before this returns, an error or not (a buffer in flight is a DMA
  // target).
  const std::string what = "optimizer state of chunk " + std::to_string(c);
  InFlight ahead(swap_, staging_, "reading ");
  size_t next = first_piece_[c];
  Status first_error = ok_status();
  auto submit = [&]() -> Status {
    uint64_t prefix = 0;
    for (const Slice& s : wanted_of(next)) prefix = std::max(prefix, s.at + s.bytes);
    const std::string& name = blob(next, gen_[next]);
    STRATA_ASSIGN_OR_RETURN(PinnedArena::Lease lease, staging_->acquire("read " + name));
    STRATA_ASSIGN_OR_RETURN(io::Ticket t, swap_->read_prefix(name, lease.buffer(), prefix));
    ahead.push({t, std::move(lease), what});
    ++next;
    return ok_status();
  };
  for (size_t u = first_piece_[c]; u < first_piece_[c + 1] && first_error.ok(); ++u) {
    while (first_error.ok() && !ahead.full() && next < first_piece_[c + 1]) first_error = submit();
    if (!first_error.ok()) break;
    PinnedArena::Lease mine;
    first_error = ahead.retire(&mine);
    for (const Slice& s : wanted_of(u)) {
      if (!first_error.ok()) break;
      first_error = slice(s.part, s.offset, {mine.data() + s.at, static_cast<size_t>(s.bytes)});
    }
  }
  return first_error;  // what is still ahead is waited for as `ahead` goes, its errors dropped
}

Status OptimizerStage::replace_state(size_t c, const StateSlice& slice) {
  STRATA_CHECK(c < elems_.size());
  for (size_t u = first_piece_[c]; u < first_piece_[c + 1]; ++u) {
    const uint64_t bytes = state_bytes(pieces_[u].elems, state_type_);
    auto fill = [&](std::byte* state) -> Status {
      for (const Slice& s : slices(u)) {
        STRATA_RETURN_IF_ERROR(slice(s.part, s.offset, {state + s.at, static_cast<size_t>(s.bytes)}));
      }
      return ok_status();
    };
    if (tier_ == Tier::kHost) {
      host_[u].assign(bytes, std::byte{0});
      STRATA_RETURN_IF_ERROR(fill(host_[u].data()));
    } else {
      STRATA_RETURN_IF_ERROR(write_staged(blob(u, gen_[u]), bytes, fill, "optimizer state of chunk " + std::to_string(c)));
    }
  }
  return ok_status();
}

namespace {
// Where each array (StateSlice's parts) of a chunk's state blob starts.
std::array<uint64_t, 5> part_starts(const StateLayout& l) { return {0, l.m, l.v, l.m_scale, l.v_scale}; }
}  // namespace

Status OptimizerStage::read_state(size_t c, std::byte* dst) {
  const std::array<uint64_t, 5> at = part_starts(StateLayout::of(elems_[c], state_type_));
  return visit_state(c, [&](int part, uint64_t offset, std::span<std::byte> bytes) {
    std::memcpy(dst + at[static_cast<size_t>(part)] + offset, bytes.data(), bytes.size());
    return ok_status();
  });
}

Status OptimizerStage::write_state(size_t c, const std::byte* src) {
  const std::array<uint64_t, 5> at = part_starts(StateLayout::of(elems_[c], state_type_));
  return replace_state(c, [&](int part, uint64_t offset, std::span<std::byte> bytes) {
    std::memcpy(bytes.data(), src + at[static_cast<size_t>(part)] + offset, bytes.size());
    return ok_status();
  });
}

cpu_optim::ParamSpan OptimizerStage::span_over(std::byte* state, int64_t n, const ChunkGrad& g, void* out,
                                               DType out_dtype) const {
  const StateLayout l = StateLayout::of(n, state_type_);
  cpu_optim::ParamSpan s;
  s.params = reinterpret_cast<float*>(state);
  s.n = n;
  s.grad = g.data;
  s.grad_dtype = g.dtype;
  s.weights_out = out;
  s.out_dtype = out_dtype;
  s.state.type = state_type_;
  s.state.m = state + l.m;
  s.state.v = state + l.v;
  if (state_type_ == cpu_optim::StateType::kQ8) {
    s.state.m_scale = reinterpret_cast<float*>(state + l.m_scale);
    s.state.v_scale = reinterpret_cast<float*>(state + l.v_scale);
  }
  return s;
}

Result<StageCounters> OptimizerStage::step(const cpu_optim::OptimizerConfig& config, int64_t t,
                                           std::span<const ChunkGrad> grads, std::span<void* const> out,
                                           DType out_dtype, const cpu_optim::StepOptions& options) {
  STRATA_CHECK_MSG(!in_step_, "optimizer stage: step() while an overlapped step is in flight");
  if (grads.size() != elems_.size() || out.size() != elems_.size()) {
    return invalid_argument("optimizer stage: " + std::to_string(elems_.size()) + " chunks, but " +
                            std::to_string(grads.size()) + " gradients and " + std::to_string(out.size()) +
                            " outputs given");
  }
  if (weights_nvme_ || grads_nvme_) {
    return failed_precondition("optimizer stage: with weights or gradients on NVMe, use begin()/finish()");
  }
  auto t0 = std::chrono::steady_clock::now();
  // The serial step: every chunk in order through the same update (and, on
  // NVMe, the same read -> update -> write pipeline) as the overlapped one.
  ov_ = OverlapStep{};
  ov_.config = config;
  ov_.t = t;
  ov_.grads.assign(grads.begin(), grads.end());
  ov_.out.assign(out.begin(), out.end());
  ov_.out_dtype = out_dtype;
  for (size_t c = 0; c < elems_.size(); ++c) ov_.order.push_back(c);
  written_.assign(elems_.size(), false);
  piece_order_.resize(pieces_.size());
  for (size_t u = 0; u < pieces_.size(); ++u) piece_order_[u] = u;
  StageCounters counters;
  if (tier_ == Tier::kNvme) {
    STRATA_ASSIGN_OR_RETURN(counters, update_pass(options, nullptr));
    for (int& g : gen_) g = 1 - g;
  } else {
    for (size_t u = 0; u < pieces_.size(); ++u) {
      STRATA_CHECK_MSG(!host_[u].empty(), "optimizer stage: chunk %zu was never initialised", pieces_[u].chunk);
      STRATA_RETURN_IF_ERROR(traced_update(u, host_[u].data(), nullptr, options, &counters));
    }
  }
  counters.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return counters;
}

}  // namespace strata::engine

namespace strata::engine {

// ---- the overlapped step ----

Status OptimizerStage::begin(OverlapStep step) {
  STRATA_CHECK_MSG(!in_step_, "optimizer stage: begin() while a step is in flight");
  const size_t C = elems_.size();
  if (step.grads.size() != C || step.out.size() != C || step.order.size() != C) {
    return invalid_argument("optimizer stage: " + std::to_string(C) + " chunks, but " +
                            std::to_string(step.grads.size()) + " gradients, " + std::to_string(step.out.size()) +
                            " outputs and " + std::to_string(step.order.size()) + " positions in the landing order");
  }
  std::vector<bool> seen(C, false);
  for (size_t c : step.order) {
    if (c >= C || seen[c]) return invalid_argument("optimizer stage: the landing order must name every chunk once");
    seen[c] = true;
  }
  if (weights_nvme_ && step.out_dtype != weights_dtype_) {
    return invalid_argument("optimizer stage: the weights on NVMe are " + std::string(dtype_name(weights_dtype_)));
  }
  if (!(step.clip_norm >= 0) || !std::isfinite(step.clip_norm)) {
    return invalid_argument("optimizer stage: clip_norm must be finite and >= 0");
  }
  if (grads_nvme_) {
    for (const ChunkGrad& g : step.grads) {
      if (g.dtype != grads_dtype_ || reinterpret_cast<uintptr_t>(g.data) % swap_->alignment() != 0) {
        return invalid_argument("optimizer stage: gradients on NVMe are " + std::string(dtype_name(grads_dtype_)) +
                                ", each in a buffer on the swap store's alignment (" +
                                std::to_string(swap_->alignment()) + " bytes)");
      }
    }
  }
  ov_ = std::move(step);
  piece_order_.clear();
  for (size_t c : ov_.order) {
    for (size_t u = first_piece_[c]; u < first_piece_[c + 1]; ++u) piece_order_.push_back(u);
  }
  if (tier_ != Tier::kNvme && next_.empty()) ov_.speculate = false;
  outcome_ = OverlapOutcome{};
  switch_generations_ = switch_ram_copies_ = false;
  stats_.assign(C, cpu_optim::GradStats{});
  written_.assign(C, false);
  {
    std::lock_guard lock(mu_);
    ready_.assign(C, {});
    landed_.assign(C, false);
    released_ = 0;
    abort_ = false;
    worker_status_ = ok_status();
    job_done_ = false;
    job_ = true;
  }
  in_step_ = true;
  if (!worker_.joinable()) worker_ = std::thread([this] { worker_loop(); });
  cv_.notify_all();
  return ok_status();
}

void OptimizerStage::land(size_t chunk, std::function<Status()> ready) {
  std::lock_guard lock(mu_);
  STRATA_CHECK_MSG(chunk < landed_.size() && !landed_[chunk], "optimizer stage: chunk %zu landed twice or unknown",
                   chunk);
  ready_[chunk] = std::move(ready);
  landed_[chunk] = true;
  cv_.notify_all();
}

Result<OverlapOutcome> OptimizerStage::finish() {
  STRATA_CHECK_MSG(in_step_, "optimizer stage: finish() without begin()");
  {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return job_done_; });
  }
  in_step_ = false;
  if (!worker_status_.ok()) return std::move(worker_status_);
  if (switch_generations_) {
    for (int& g : gen_) g = 1 - g;
  }
  if (switch_ram_copies_) {
    for (size_t u = 0; u < host_.size(); ++u) host_[u].swap(next_[u]);
  }
  return outcome_;
}

Status OptimizerStage::async_error() {
  std::lock_guard lock(mu_);
  if (job_done_ && !worker_status_.ok()) return worker_status_;
  return ok_status();
}

void OptimizerStage::cancel() {
  if (!in_step_) return;
  {
    std::unique_lock lock(mu_);
    abort_ = true;
    cv_.notify_all();
    cv_.wait(lock, [&] { return job_done_; });
  }
  in_step_ = false;
}

Status OptimizerStage::wait_landed(size_t c) {
  std::function<Status()> ready;
  {
    const auto t0 = std::chrono::steady_clock::now();
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return landed_[c] || abort_; });
    idle_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!landed_[c]) {
      return cancelled("optimizer stage: the step was abandoned before chunk " + std::to_string(c) +
                       "'s gradient landed");
    }
    ready = std::move(ready_[c]);
  }
  if (ready) STRATA_RETURN_IF_ERROR_CTX(ready(), "gradient of chunk " + std::to_string(c));
  if (grads_nvme_) STRATA_RETURN_IF_ERROR(write_gradient(c));
  // A speculative update takes the statistics from its own read of the
  // gradient (StepOptions::stats, piece by piece in order: the bits of one
  // grad_stats over the chunk); otherwise they come first, on their own.
  if (ov_.speculate) return ok_status();
  double start = trace_ ? trace_->now_us() : 0;
  STRATA_ASSIGN_OR_RETURN(stats_[c], cpu_optim::grad_stats(ov_.grads[c].data, ov_.grads[c].dtype, elems_[c],
                                                           ov_.grad_scale, *executor_));
  if (trace_) trace_->span("optimizer", "gradient stats chunk " + std::to_string(c), start, trace_->now_us(), "optimizer");
  return ok_status();
}

// The NVMe read -> update -> write pipeline over the pieces in landing
// order, with as many pieces in flight as the staging arena has buffers.
// Reads come from each piece's current blob, writes go to its other one.
class OptimizerStage::Pipeline {
 public:
  explicit Pipeline(OptimizerStage& s)
      : s_(s), U_(s.pieces_.size()), lease_(U_), reads_(U_), writes_(U_), weight_writes_(U_), grad_reads_(U_) {}
  ~Pipeline() { drain(); }

  // Gradients on NVMe: from here on every update takes its piece's gradient
  // from its blob, read beside the state (the blobs are complete: every
  // chunk landed and its writes were waited for).
  void read_gradients() { grads_ = true; }

  // Issues reads for positions < upto of the piece order, freeing buffers of finished writes as needed.
  Status fill(size_t upto) {
    upto = std::min(upto, U_);
    while (next_read_ < upto) {
      if (s_.staging_->in_use() >= s_.staging_->capacity()) {
        if (pending_writes_.empty()) break;
        STRATA_RETURN_IF_ERROR(retire_oldest_write());
        continue;
      }
      const size_t u = s_.piece_order_[next_read_];
      const std::string& name = s_.blob(u, s_.gen_[u]);
      STRATA_ASSIGN_OR_RETURN(lease_[u], s_.staging_->acquire(name));
      STRATA_ASSIGN_OR_RETURN(io::Ticket t, s_.swap_->read(name, lease_[u].buffer()));
      reads_[u] = t;
      s_.moved(u, Residency::kLoading);
      ++next_read_;
    }
    // Each leased buffer's gradient (pieces read ahead before the gradients
    // were complete get theirs now).
    while (grads_ && next_grad_read_ < next_read_) {
      const size_t u = s_.piece_order_[next_grad_read_];
      io::IoBuffer buf{lease_[u].data() + s_.gradient_offset(u), s_.swap_->padded_size(s_.gradient_bytes(u))};
      STRATA_ASSIGN_OR_RETURN(io::Ticket t, s_.swap_->read(s_.gradient_blob(u), buf));
      grad_reads_[u] = t;
      ++next_grad_read_;
    }
    return ok_status();
  }

  // Updates the piece at position k of the piece order and issues its write.
  Status update(size_t k, const cpu_optim::StepOptions& options) {
    const size_t u = s_.piece_order_[k];
    const size_t c = s_.pieces_[u].chunk;
    STRATA_RETURN_IF_ERROR(fill(k + 1));
    STRATA_CHECK_MSG(reads_[u].has_value(), "optimizer stage: piece %zu updated before it was read", u);
    const uint64_t bytes = state_bytes(s_.pieces_[u].elems, s_.state_type_);
    Status rs = s_.swap_->wait(*reads_[u]);
    reads_[u].reset();
    STRATA_RETURN_IF_ERROR_CTX(std::move(rs), "reading optimizer state of chunk " + std::to_string(c));
    counters.nvme_bytes_read += bytes;
    s_.moved(u, Residency::kOnHost);
    const void* grad = nullptr;
    if (grads_) {
      STRATA_CHECK_MSG(grad_reads_[u].has_value(), "optimizer stage: piece %zu updated before its gradient was read",
                       u);
      Status gs = s_.swap_->wait(*grad_reads_[u]);
      grad_reads_[u].reset();
      STRATA_RETURN_IF_ERROR_CTX(std::move(gs), "reading the gradient of chunk " + std::to_string(c));
      counters.nvme_bytes_read += s_.gradient_bytes(u);
      grad = lease_[u].data() + s_.gradient_offset(u);
    }
    const uint64_t woff = s_.weights_nvme_ ? s_.weights_offset(u) : 0;
    void* out = s_.weights_nvme_ ? static_cast<void*>(lease_[u].data() + woff) : nullptr;
    STRATA_RETURN_IF_ERROR(s_.traced_update(u, lease_[u].data(), out, options, &counters, nullptr, grad));
    s_.moved(u, Residency::kDirty);
    STRATA_ASSIGN_OR_RETURN(io::Ticket w, s_.swap_->write(s_.blob(u, 1 - s_.gen_[u]), lease_[u].buffer(), bytes));
    writes_[u] = w;
    pending_writes_.push_back(u);
    counters.nvme_bytes_written += bytes;
    if (s_.weights_nvme_) {
      const uint64_t wbytes = 2 * static_cast<uint64_t>(s_.pieces_[u].elems);
      io::IoBuffer wbuf{lease_[u].data() + woff, lease_[u].buffer().capacity_bytes - woff};
      STRATA_ASSIGN_OR_RETURN(io::Ticket ww, s_.swap_->write(s_.weights_blob(u, 1 - s_.gen_[u]), wbuf, wbytes));
      weight_writes_[u] = ww;
      counters.nvme_bytes_written += wbytes;
    }
    return ok_status();
  }

  Status finish_writes() {
    while (!pending_writes_.empty()) STRATA_RETURN_IF_ERROR(retire_oldest_write());
    return ok_status();
  }

  StageCounters counters;

 private:
  Status retire_oldest_write() {
    const size_t u = pending_writes_.front();
    pending_writes_.pop_front();
    Status s = s_.swap_->wait(*writes_[u]);
    writes_[u].reset();
    if (weight_writes_[u]) {
      Status w = s_.swap_->wait(*weight_writes_[u]);
      weight_writes_[u].reset();
      if (s.ok() && !w.ok()) s = std::move(w);
    }
    lease_[u] = PinnedArena::Lease();
    s_.moved(u, Residency::kOnNvme);
    if (s.ok()) return s;
    return std::move(s).with_context("writing optimizer state of chunk " + std::to_string(s_.pieces_[u].chunk));
  }
  // Every issued request is waited for before its buffer's lease can end,
  // on the error path too: the kernel may still be writing into it.
  void drain() {
    for (size_t u = 0; u < U_; ++u) {
      if (reads_[u]) s_.swap_->wait(*reads_[u]).ignore();
      if (grad_reads_[u]) s_.swap_->wait(*grad_reads_[u]).ignore();
      if (writes_[u]) s_.swap_->wait(*writes_[u]).ignore();
      if (weight_writes_[u]) s_.swap_->wait(*weight_writes_[u]).ignore();
      // A buffer dropped unwritten: the blob on NVMe is what the piece has.
      if (lease_[u].valid()) s_.moved(u, Residency::kOnNvme);
    }
  }

  OptimizerStage& s_;
  const size_t U_;
  std::vector<PinnedArena::Lease> lease_;
  std::vector<std::optional<io::Ticket>> reads_, writes_, weight_writes_, grad_reads_;
  std::deque<size_t> pending_writes_;
  size_t next_read_ = 0;
  bool grads_ = false;  // read_gradients()
  size_t next_grad_read_ = 0;
};

Status OptimizerStage::traced_update(size_t piece, std::byte* state, void* out, const cpu_optim::StepOptions& options,
                                     StageCounters* counters, std::byte* state_next, const void* grad) {
  const double start = trace_ ? trace_->now_us() : 0;
  const Piece& p = pieces_[piece];
  // The piece's part of its chunk's gradient (or the one read for it) and new weights.
  ChunkGrad g = ov_.grads[p.chunk];
  const uint64_t at = dtype_bytes(g.dtype) * static_cast<uint64_t>(p.offset);
  g.data = grad != nullptr ? grad : static_cast<const std::byte*>(g.data) + at;
  if (out == nullptr && ov_.out[p.chunk] != nullptr) {
    out = static_cast<std::byte*>(ov_.out[p.chunk]) + dtype_bytes(ov_.out_dtype) * static_cast<uint64_t>(p.offset);
    written_[p.chunk] = true;  // before the update: a failing one may have written part of it
  }
  cpu_optim::ParamSpan span = span_over(state, p.elems, g, out, ov_.out_dtype);
  if (state_next != nullptr) {
    const cpu_optim::ParamSpan next = span_over(state_next, p.elems, g, out, ov_.out_dtype);
    span.params_next = next.params;
    span.state_next = next.state;
  }
  Result<cpu_optim::StepReport> r = cpu_optim::step(ov_.config, ov_.t, span, options, *executor_);
  if (!r) return std::move(r).error().with_context("optimizer step of chunk " + std::to_string(p.chunk));
  counters->nonfinite += r->nonfinite;
  if (trace_) {
    const size_t count = pieces_of(p.chunk);
    trace_->span("optimizer",
                 "update chunk " + std::to_string(p.chunk) +
                     (count == 1 ? "" : " piece " + std::to_string(p.index + 1) + "/" + std::to_string(count)) +
                     (options.stats != nullptr ? " + gradient stats" : ""),
                 start, trace_->now_us(), "optimizer");
  }
  return ok_status();
}

Result<StageCounters> OptimizerStage::update_pass(const cpu_optim::StepOptions& options, Pipeline* prefetched) {
  std::optional<Pipeline> fresh;
  Pipeline* pipe = prefetched;
  if (pipe == nullptr) pipe = &fresh.emplace(*this);
  if (grads_nvme_) pipe->read_gradients();
  const size_t ahead = staging_->capacity() - 1;  // one buffer for the write behind
  for (size_t k = 0; k < piece_order_.size(); ++k) {
    STRATA_RETURN_IF_ERROR(pipe->fill(k + ahead));
    STRATA_RETURN_IF_ERROR(pipe->update(k, options));
  }
  STRATA_RETURN_IF_ERROR(pipe->finish_writes());
  return pipe->counters;
}

namespace {
// `stats`: where the update also sums the gradient's statistics (a
// speculative update's; null when they were taken before).
cpu_optim::StepOptions scaled(float grad_scale, cpu_optim::GradStats* stats = nullptr) {
  cpu_optim::StepOptions o;
  o.nonfinite = cpu_optim::NonFinitePolicy::kReportOnly;  // the verdict is taken over the whole model
  o.grad_scale = grad_scale;
  o.stats = stats;
  return o;
}
}  // namespace

Status OptimizerStage::run_overlap() {
  Status s = run_overlap_body();
  // No gradient write outlives the step: the caller reuses its buffers.
  Status drained = grads_nvme_ ? wait_gradient_writes(0, pieces_.size()) : ok_status();
  if (s.ok()) s = std::move(drained);
  return s;
}

Status OptimizerStage::run_overlap_body() {
  auto t0 = std::chrono::steady_clock::now();
  idle_s_ = 0;
  const size_t C = elems_.size();
  const bool nvme = tier_ == Tier::kNvme;
  // Staging buffers: one for the write behind, the rest read ahead.
  const size_t ahead = nvme ? staging_->capacity() - 1 : 0;
  std::optional<Pipeline> pipe;
  if (nvme) pipe.emplace(*this);
  if (ov_.speculate && nvme) {
    for (size_t k = 0; k < piece_order_.size(); ++k) {
      STRATA_RETURN_IF_ERROR(pipe->fill(k + ahead));
      const Piece& p = pieces_[piece_order_[k]];
      if (p.index == 0) STRATA_RETURN_IF_ERROR(wait_landed(p.chunk));
      STRATA_RETURN_IF_ERROR(pipe->update(k, scaled(ov_.grad_scale, &stats_[p.chunk])));
      if (grads_nvme_ && p.index + 1 == pieces_of(p.chunk)) STRATA_RETURN_IF_ERROR(release_gradient(p.chunk));
    }
    STRATA_RETURN_IF_ERROR(pipe->finish_writes());
  } else if (ov_.speculate) {
    // In RAM: each chunk's update goes into its second copy; the first stays
    // as it was until the verdict.
    for (size_t u : piece_order_) {
      const size_t c = pieces_[u].chunk;
      if (pieces_[u].index == 0) STRATA_RETURN_IF_ERROR(wait_landed(c));
      STRATA_RETURN_IF_ERROR(traced_update(u, host_[u].data(), nullptr, scaled(ov_.grad_scale, &stats_[c]),
                                           &outcome_.counters, next_[u].data()));
    }
  } else {
    if (nvme) STRATA_RETURN_IF_ERROR(pipe->fill(ahead));
    for (size_t k = 0; k < C; ++k) {
      STRATA_RETURN_IF_ERROR(wait_landed(ov_.order[k]));
      // Its statistics taken, its blobs written: its buffer is free.
      if (grads_nvme_) STRATA_RETURN_IF_ERROR(release_gradient(ov_.order[k]));
    }
  }
  // The verdict over the whole model, summed in chunk order (deterministic).
  double sum_squares = 0;
  int64_t nonfinite = 0;
  for (size_t c = 0; c < C; ++c) {
    sum_squares += stats_[c].sum_squares;
    nonfinite += stats_[c].nonfinite;
  }
  OverlapOutcome& o = outcome_;
  o.grad_norm = std::sqrt(sum_squares);
  o.skipped = nonfinite > 0;
  float scale = ov_.grad_scale;
  if (!o.skipped && ov_.clip_norm > 0 && o.grad_norm > ov_.clip_norm) {
    scale = ov_.grad_scale * static_cast<float>(ov_.clip_norm / o.grad_norm);
    o.clipped = true;
  }
  const bool guess_held = ov_.speculate && !o.skipped && scale == ov_.grad_scale;
  o.rolled_back = ov_.speculate && !guess_held;
  if (!o.skipped && !guess_held) {
    // Updates with the true scale: first ones, or redone from the old blobs.
    if (nvme) {
      if (ov_.speculate) pipe.emplace(*this);  // a fresh pass over the old states
      STRATA_RETURN_IF_ERROR(update_pass(scaled(scale), &*pipe).status());  // counted with the pipeline below
    } else {
      for (size_t u : piece_order_) {
        STRATA_RETURN_IF_ERROR(traced_update(u, host_[u].data(), nullptr, scaled(scale), &o.counters));
      }
    }
  }
  if (pipe) {
    o.counters.nvme_bytes_read += pipe->counters.nvme_bytes_read;
    o.counters.nvme_bytes_written += pipe->counters.nvme_bytes_written;
    o.counters.nonfinite += pipe->counters.nonfinite;
    pipe.reset();
  }
  // Every piece now holds its new state in its other blob (on NVMe), or in
  // its second copy (in RAM, a confirmed guess): finish() switches to them
  // on the caller's thread, so that what the caller reads of the stage
  // while a step runs (weights_blobs, beside a delayed update) is the last
  // finished step's, and a cancelled step switches nothing.
  switch_generations_ = nvme && !o.skipped;
  switch_ram_copies_ = !nvme && guess_held;
  o.counters.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() - idle_s_;
  return ok_status();
}

}  // namespace strata::engine
