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

Status OptimizerStage::restore_stale_weights(std::vector<bool>* stale, const std::vector<void*>& weights,
                                             const std::vector<DType>& dtypes, bool mark_written) {
  if (mark_written) {
    for (size_t c = 0; c < written_.size() && c < stale->size(); ++c) (*stale)[c] = (*stale)[c] || written_[c];
  }
  for (size_t c = 0; c < stale->size(); ++c) {
    if (!(*stale)[c]) continue;
    STRATA_RETURN_IF_ERROR(weights_from_master(c, weights.at(c), dtypes.at(c))
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
