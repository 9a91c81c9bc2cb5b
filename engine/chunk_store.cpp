#include "engine/chunk_store.h"

#include <algorithm>
#include <chrono>

#include "common/dtype.h"

namespace strata::engine {

std::string_view view_name(View view) {
  switch (view) {
    case View::kWeights: return "weights";
    case View::kGradient: return "gradient";
    case View::kMaster: return "master";
    case View::kAdamM: return "adam m";
    case View::kAdamV: return "adam v";
  }
  return "?";
}

std::string_view residency_name(Residency residency) {
  switch (residency) {
    case Residency::kOnNvme: return "on nvme";
    case Residency::kLoading: return "loading";
    case Residency::kOnHost: return "on host";
    case Residency::kCopying: return "copying";
    case Residency::kOnDevice: return "on device";
    case Residency::kDirty: return "dirty";
  }
  return "?";
}

double WaitMeter::now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void WaitMeter::note(double t0_s, const char* what) {
  const double waited = now_s() - t0_s;
  if (counting_) wait_s_ += waited;
  if (trace_ != nullptr && waited > 20e-6) {
    const double end = trace_->now_us();
    trace_->span("compute", std::string("wait: ") + what, end - waited * 1e6, end, "wait");
  }
}

Status WaitMeter::wait(gpu::Device& device, gpu::Event event, const char* what) {
  const double t0 = now_s();
  Status s = device.synchronize(event);
  note(t0, what);
  return s;
}

ChunkStoreBytes chunk_store_bytes(const std::vector<int64_t>& chunk_elems, const ChunkStoreOptions& options) {
  ChunkStoreBytes b;
  auto bytes_of = [&](size_t c) { return static_cast<uint64_t>(chunk_elems[c]) * dtype_bytes(options.dtype_of(c)); };
  uint64_t max_chunk = 0;
  for (size_t i = options.resident_first ? 1 : 0; i < chunk_elems.size(); ++i) {
    max_chunk = std::max(max_chunk, bytes_of(i));
  }
  // Each allocation as the device charges it (whole allocation units).
  b.slot = gpu::device_allocation_bytes(max_chunk);
  b.weight_slots = options.prefetch_depth + 1;
  if (options.resident_first && !chunk_elems.empty()) {
    const uint64_t first = bytes_of(0);
    b.resident = gpu::device_allocation_bytes(first);
    b.resident_gradients = gpu::device_allocation_bytes(first * static_cast<uint64_t>(options.micro_batches));
  }
  return b;
}

Result<std::unique_ptr<ChunkStore>> ChunkStore::create(std::vector<int64_t> chunk_elems, gpu::Device& device,
                                                       gpu::Stream copy, WaitMeter* meter,
                                                       ChunkStoreOptions options) {
  if (chunk_elems.size() < (options.resident_first ? 2u : 1u)) {
    return invalid_argument(options.resident_first ? "chunk store: needs the resident chunk and at least one more"
                                                   : "chunk store: needs at least one chunk");
  }
  if (options.micro_batches < 1) return invalid_argument("chunk store: micro_batches must be >= 1");
  if (options.prefetch_depth < 1 || options.prefetch_depth > 1024) {
    return invalid_argument("prefetch depth must be 1..1024");
  }
  if (options.states != Tier::kHost && options.states != Tier::kNvme) {
    return invalid_argument("chunk store: the optimizer states live on the host or on NVMe");
  }
  if (meter == nullptr) return invalid_argument("chunk store: needs a wait meter");
  if (!options.chunk_dtypes.empty() && options.chunk_dtypes.size() != chunk_elems.size()) {
    return invalid_argument("chunk store: " + std::to_string(chunk_elems.size()) + " chunks, but " +
                            std::to_string(options.chunk_dtypes.size()) + " chunk types");
  }
  std::unique_ptr<ChunkStore> s(new ChunkStore());
  s->elems_ = std::move(chunk_elems);
  s->dev_ = &device;
  s->copy_ = copy;
  s->meter_ = meter;
  s->depth_ = options.prefetch_depth;
  for (size_t c = 0; c < s->elems_.size(); ++c) {
    s->es_.push_back(dtype_bytes(options.dtype_of(c)));
  }
  s->states_home_ = options.states;
  s->resident_first_ = options.resident_first;
  if (options.host_memory != nullptr) s->allocator_ = options.host_memory;
  const size_t n = s->elems_.size();
  const ChunkStoreBytes bytes = chunk_store_bytes(s->elems_, options);
  for (int k = 0; k < bytes.weight_slots; ++k) {
    STRATA_ASSIGN_OR_RETURN(gpu::DeviceMemory slot, device.allocate(bytes.slot, "weight chunk buffer"));
    s->slots_.push_back(std::move(slot));
  }
  for (int k = 0; k < bytes.gradient_slots; ++k) {
    STRATA_ASSIGN_OR_RETURN(gpu::DeviceMemory slot, device.allocate(bytes.slot, "gradient chunk buffer"));
    s->grad_slots_.push_back(std::move(slot));
  }
  s->micro_batches_ = options.micro_batches;
  if (s->resident_first_) {
    STRATA_ASSIGN_OR_RETURN(s->resident_, device.allocate(bytes.resident, "embedding weights"));
    STRATA_ASSIGN_OR_RETURN(s->resident_grad_, device.allocate(bytes.resident_gradients, "embedding gradients"));
  }
  s->grad_slot_done_.assign(s->grad_slots_.size(), gpu::Event{});
  s->grad_slot_held_.assign(s->grad_slots_.size(), std::nullopt);
  s->grad_slot_of_.assign(n, std::nullopt);
  s->grad_copied_.assign(n, gpu::Event{});
  s->slot_chunk_.assign(s->slots_.size(), std::nullopt);
  s->slot_uses_.assign(s->slots_.size(), 0);
  s->slot_ready_.assign(s->slots_.size(), gpu::Event{});
  s->slot_free_.assign(s->slots_.size(), gpu::Event{});
  const Residency states = options.states == Tier::kNvme ? Residency::kOnNvme : Residency::kOnHost;
  s->state_.assign(n, {Residency::kOnHost, Residency::kOnHost});
  s->state_pieces_.assign(n, std::vector<Residency>{states});
  return s;
}

ChunkStore::~ChunkStore() {
  if (dev_ != nullptr) {
    dev_->synchronize(copy_).ignore();
    dev_->synchronize(gradient_stream()).ignore();
  }
  if (nvme_) drain_weight_reads();
}

Status ChunkStore::set_nvme_weights(NvmeWeights source) {
  if (source.swap == nullptr || !source.blobs) return invalid_argument("chunk store: NVMe weights need a store");
  uint64_t max_all = 0;
  for (size_t c = 0; c < elems_.size(); ++c) max_all = std::max(max_all, bytes_of(c));
  const int ring = depth_ + 3;
  STRATA_ASSIGN_OR_RETURN(weight_arena_, PinnedArena::create("weight staging", source.swap->padded_size(max_all),
                                                             static_cast<uint32_t>(ring), *allocator_));
  weight_buf_.clear();
  weight_read_.assign(static_cast<size_t>(ring), {});
  weight_read_chunk_.assign(static_cast<size_t>(ring), std::nullopt);
  weight_copied_.assign(static_cast<size_t>(ring), gpu::Event{});
  for (int i = 0; i < ring; ++i) {
    STRATA_ASSIGN_OR_RETURN(PinnedArena::Lease lease, weight_arena_->acquire("weight staging"));
    weight_buf_.push_back(std::move(lease));
  }
  nvme_ = std::move(source);
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& s : state_) s[static_cast<size_t>(View::kWeights)] = Residency::kOnNvme;
  return ok_status();
}

static_assert(static_cast<size_t>(View::kWeights) == 0 && static_cast<size_t>(View::kGradient) == 1,
              "state_ holds the weights and gradient views by their index");

void ChunkStore::set_state(size_t chunk, View view, Residency r) {
  STRATA_CHECK_MSG(view == View::kWeights || view == View::kGradient, "chunk store: the state views move by piece");
  std::lock_guard<std::mutex> lock(mu_);
  state_[chunk][static_cast<size_t>(view)] = r;
}

void ChunkStore::set_state_pieces(size_t chunk, size_t pieces) {
  STRATA_CHECK_MSG(chunk < elems_.size() && pieces >= 1, "chunk store: no chunk %zu, or no pieces", chunk);
  std::lock_guard<std::mutex> lock(mu_);
  state_pieces_[chunk].assign(pieces, state_pieces_[chunk].front());
}

size_t ChunkStore::state_pieces(size_t chunk) const {
  std::lock_guard<std::mutex> lock(mu_);
  return state_pieces_.at(chunk).size();
}

void ChunkStore::states_moved(size_t chunk, Residency now, size_t piece) {
  STRATA_CHECK_MSG(chunk < elems_.size(), "chunk store: no chunk %zu", chunk);
  std::lock_guard<std::mutex> lock(mu_);
  STRATA_CHECK_MSG(piece < state_pieces_[chunk].size(), "chunk store: chunk %zu has no state piece %zu", chunk, piece);
  state_pieces_[chunk][piece] = now;
}

Residency ChunkStore::residency(size_t chunk, View view, size_t piece) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (view == View::kMaster || view == View::kAdamM || view == View::kAdamV) return state_pieces_.at(chunk).at(piece);
  STRATA_CHECK_MSG(piece == 0, "chunk store: the %s view has one piece", std::string(view_name(view)).c_str());
  return state_.at(chunk)[static_cast<size_t>(view)];
}

Tier ChunkStore::home(size_t chunk, View view) const {
  STRATA_CHECK_MSG(chunk < elems_.size(), "chunk store: no chunk %zu", chunk);
  switch (view) {
    case View::kWeights: return nvme_ ? Tier::kNvme : Tier::kHost;
    case View::kGradient: return Tier::kHost;
    default: return states_home_;
  }
}

void ChunkStore::drain_weight_reads() {
  for (size_t i = 0; i < weight_read_.size(); ++i) {
    for (io::Ticket t : weight_read_[i]) nvme_->swap->wait(t).ignore();
    weight_read_[i].clear();
    weight_read_chunk_[i].reset();
  }
}

std::optional<size_t> ChunkStore::chunk_at(size_t pos) const {
  if (pos == cur_pos_) return cur_chunk_;
  if (schedule_.known(pos)) return schedule_.chunk_at(pos);
  return std::nullopt;
}

size_t ChunkStore::next_use(size_t chunk, size_t after) const {
  for (size_t p = after + 1; schedule_.known(p); ++p) {
    if (schedule_.chunk_at(p) == chunk) return p;
  }
  return kNoPosition;  // not used again as far as the schedule knows
}

Status ChunkStore::read_weights_ahead(size_t through) {
  while (weights_read_ <= through) {
    const size_t pos = weights_read_;
    const std::optional<size_t> chunk = chunk_at(pos);
    if (!chunk) break;  // not known yet: read when it is used
    const size_t b = pos % weight_buf_.size();
    STRATA_CHECK_MSG(weight_read_[b].empty(), "chunk store: weight staging buffer %zu still busy", b);
    // The buffer's last copy to the device reads it until done.
    if (gpu::Event& copied = weight_copied_[b]; copied.id >= 0) {
      STRATA_RETURN_IF_ERROR(meter_->wait(*dev_, copied, "weight staging"));
      copied = gpu::Event{};
    }
    STRATA_ASSIGN_OR_RETURN(weight_read_[b], read_weight_pieces(*chunk, weight_buf_[b]));
    weight_read_chunk_[b] = *chunk;
    {
      std::lock_guard<std::mutex> lock(mu_);
      Residency& r = state_[*chunk][static_cast<size_t>(View::kWeights)];
      if (r == Residency::kOnNvme) r = Residency::kLoading;
    }
    ++weights_read_;
  }
  return ok_status();
}

Result<std::vector<io::Ticket>> ChunkStore::read_weight_pieces(size_t chunk, const PinnedArena::Lease& buf) {
  std::vector<io::Ticket> reads;
  const io::IoBuffer whole = buf.buffer();
  for (const BlobPiece& piece : nvme_->blobs(chunk)) {
    if (piece.offset_bytes % nvme_->swap->alignment() != 0 || piece.offset_bytes >= whole.capacity_bytes) {
      for (io::Ticket t : reads) nvme_->swap->wait(t).ignore();
      return internal_error("chunk store: weight piece " + piece.blob + " at byte " + std::to_string(piece.offset_bytes) +
                            " does not fit an aligned place in the staging buffer");
    }
    Result<io::Ticket> t = nvme_->swap->read(
        piece.blob, {whole.data + piece.offset_bytes, whole.capacity_bytes - piece.offset_bytes});
    if (!t) {
      for (io::Ticket r : reads) nvme_->swap->wait(r).ignore();  // the buffer is reused: nothing may still land in it
      return std::move(t).error().with_context("reading the weights of chunk " + std::to_string(chunk));
    }
    reads.push_back(*t);
  }
  return reads;
}

Status ChunkStore::wait_reads(std::vector<io::Ticket>& reads, size_t chunk) {
  Status first = ok_status();
  for (io::Ticket t : reads) {
    Status s = nvme_->swap->wait(t);
    if (first.ok() && !s.ok()) first = std::move(s);
  }
  reads.clear();
  return first.with_context("reading the weights of chunk " + std::to_string(chunk));
}

Result<const void*> ChunkStore::stage_nvme_weights(size_t pos, size_t chunk) {
  // The whole ring ahead: while this chunk is copied, the next depth + 2
  // known uses are on their way from NVMe.
  const size_t ring = weight_buf_.size();
  STRATA_RETURN_IF_ERROR(read_weights_ahead(pos + ring - 1));
  const size_t b = pos % ring;
  STRATA_CHECK_MSG(!weight_read_[b].empty(), "chunk store: no read issued for position %zu", pos);
  const double t0 = WaitMeter::now_s();
  Status s = wait_reads(weight_read_[b], chunk);
  meter_->note(t0, "weights from nvme");
  weight_read_chunk_[b].reset();
  STRATA_RETURN_IF_ERROR(s);
  set_state(chunk, View::kWeights, Residency::kOnHost);
  return static_cast<const void*>(weight_buf_[b].data());
}

Status ChunkStore::begin_step(const std::vector<const void*>& host_weights, bool same_weights) {
  if (host_weights.size() != elems_.size()) {
    return invalid_argument("chunk store: expected " + std::to_string(elems_.size()) + " chunks");
  }
  // Only a pass that followed a complete one may keep its slots.
  same_weights = same_weights && passes_complete_;
  passes_complete_ = false;
  host_weights_ = host_weights;
  issued_ = 0;
  weights_read_ = 0;
  slot_hits_ = 0;
  slot_uses_.assign(slots_.size(), 0);
  if (!same_weights) {
    // The weights change between steps: nothing in a slot carries over.
    slot_chunk_.assign(slots_.size(), std::nullopt);
    slot_ready_.assign(slots_.size(), gpu::Event{});
  }
  pos_slot_.clear();
  grad_slot_done_.assign(grad_slot_done_.size(), gpu::Event{});
  grad_slot_held_.assign(grad_slot_held_.size(), std::nullopt);
  grad_slot_of_.assign(elems_.size(), std::nullopt);
  next_grad_slot_ = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t c = 0; c < elems_.size(); ++c) {
      state_[c][static_cast<size_t>(View::kWeights)] = weights_home_state();
      state_[c][static_cast<size_t>(View::kGradient)] = Residency::kOnHost;
      grad_copied_[c] = gpu::Event{};
    }
    if (same_weights) {
      if (resident_first_) state_[0][static_cast<size_t>(View::kWeights)] = Residency::kOnDevice;
      for (const std::optional<size_t>& c : slot_chunk_) {
        if (c) state_[*c][static_cast<size_t>(View::kWeights)] = Residency::kOnDevice;
      }
    }
  }
  schedule_.begin_step();
  cur_pos_ = kNoPosition;
  if (same_weights || !resident_first_) return issue_ahead(0);  // chunk 0 is on the device already, or slotted
  // Chunk 0 stays resident for the step.
  const void* src = host_weights_[0];
  if (nvme_) {
    // Read into the ring's first buffer, which position 0's read waits to
    // reuse until this copy is done.
    set_state(0, View::kWeights, Residency::kLoading);
    STRATA_ASSIGN_OR_RETURN(std::vector<io::Ticket> reads, read_weight_pieces(0, weight_buf_[0]));
    STRATA_RETURN_IF_ERROR(wait_reads(reads, 0));
    src = weight_buf_[0].data();
  }
  if (src == nullptr) return invalid_argument("chunk store: no host weights for chunk 0");
  STRATA_RETURN_IF_ERROR(dev_->copy_to_device(copy_, resident_.data(), src, bytes_of(0)));
  STRATA_ASSIGN_OR_RETURN(resident_ready_, dev_->record(copy_));
  set_state(0, View::kWeights, Residency::kCopying);
  if (nvme_) weight_copied_[0] = resident_ready_;
  h2d_bytes_ += bytes_of(0);
  return issue_ahead(0);  // the first uses on their way (once recorded)
}

Result<const void*> ChunkStore::resident_weights() {
  if (!resident_first_) return failed_precondition("chunk store: no chunk is resident (acquire chunk 0)");
  STRATA_RETURN_IF_ERROR(meter_->wait(*dev_, resident_ready_, "embedding"));
  set_state(0, View::kWeights, Residency::kOnDevice);
  return static_cast<const void*>(resident_.data());
}

Status ChunkStore::issue_ahead(size_t current) {
  // The weight slots hold chunks, not positions: a use whose chunk is still
  // in a slot (the final chunk at the turn, the last blocks of forward again
  // at the start of backward) takes it without a copy. Otherwise the copy
  // goes into a slot no pending use references, the one whose chunk is used
  // again farthest ahead.
  while (issued_ <= current + static_cast<size_t>(depth_)) {
    const size_t pos = issued_;
    const std::optional<size_t> chunk = chunk_at(pos);
    if (!chunk) break;  // not predicted: fetched when it is used
    if (pos_slot_.size() <= pos) pos_slot_.resize(pos + 1, kNoPosition);
    size_t slot = kNoPosition;
    for (size_t k = 0; k < slots_.size(); ++k) {
      if (slot_chunk_[k] == chunk) slot = k;
    }
    if (slot != kNoPosition) {
      if (nvme_) {
        // Every earlier position was read (staged) or skipped (a hit) in order.
        STRATA_CHECK_MSG(weights_read_ >= pos, "chunk store: position %zu's read was passed over", pos);
        if (weights_read_ == pos) {
          weights_read_ = pos + 1;  // not read yet: it never will be
        } else if (std::vector<io::Ticket>& t = weight_read_[pos % weight_buf_.size()]; !t.empty()) {
          // Already read ahead by position: let it land unused.
          Status s = wait_reads(t, *chunk);
          weight_read_chunk_[pos % weight_buf_.size()].reset();
          STRATA_RETURN_IF_ERROR(s);
        }
      }
      ++slot_hits_;
    } else {
      size_t farthest = 0;
      for (size_t k = 0; k < slots_.size(); ++k) {
        if (slot_uses_[k] > 0) continue;  // a use still to be computed reads it
        if (!slot_chunk_[k]) {            // empty: nothing is better
          slot = k;
          break;
        }
        // Before the schedule is known (the first step) every chunk's next
        // use is unknown: an empty slot later in the scan is still better
        // than evicting one a later use may find.
        const size_t next = next_use(*slot_chunk_[k], pos);
        if (slot == kNoPosition || next > farthest) {
          slot = k;
          farthest = next;
        }
      }
      if (slot == kNoPosition && pos > current) break;  // every slot referenced: fetched later
      if (slot == kNoPosition) {
        return resource_exhausted("chunk store: all " + std::to_string(slots_.size()) +
                                  " weight slots are referenced; release a use before acquiring chunk " +
                                  std::to_string(*chunk) + " (prefetch depth " + std::to_string(depth_) + ")");
      }
      const void* src = host_weights_[*chunk];
      if (nvme_) {
        STRATA_ASSIGN_OR_RETURN(src, stage_nvme_weights(pos, *chunk));
      }
      if (src == nullptr) return invalid_argument("chunk store: no host weights for chunk " + std::to_string(*chunk));
      if (const std::optional<size_t> evicted = slot_chunk_[slot]) {
        // Its device copy is gone: back to its home (or to the read already under way).
        bool reading = false;
        for (const std::optional<size_t>& c : weight_read_chunk_) reading = reading || c == evicted;
        set_state(*evicted, View::kWeights, reading ? Residency::kLoading : weights_home_state());
      }
      if (slot_free_[slot].id >= 0) {  // a model's stream may still read it
        STRATA_RETURN_IF_ERROR(dev_->stream_wait(copy_, slot_free_[slot]));
        slot_free_[slot] = gpu::Event{};
      }
      STRATA_RETURN_IF_ERROR(dev_->copy_to_device(copy_, slots_[slot].data(), src, bytes_of(*chunk)));
      STRATA_ASSIGN_OR_RETURN(slot_ready_[slot], dev_->record(copy_));
      if (nvme_) weight_copied_[pos % weight_buf_.size()] = slot_ready_[slot];
      slot_chunk_[slot] = *chunk;
      set_state(*chunk, View::kWeights, Residency::kCopying);
      h2d_bytes_ += bytes_of(*chunk);
    }
    pos_slot_[pos] = slot;
    ++slot_uses_[slot];
    ++issued_;
  }
  return ok_status();
}

void ChunkStore::drop_use(size_t pos) {
  const size_t slot = pos_slot_[pos];
  STRATA_CHECK_MSG(slot_uses_[slot] > 0, "chunk store: position %zu's slot %zu has no use to drop", pos, slot);
  --slot_uses_[slot];
}

// acquire's body: with `ready`, the copy's event instead of a wait for it.
Result<ChunkStore::Use> ChunkStore::take(size_t chunk, gpu::Event* ready) {
  if (chunk < first_slotted() || chunk >= elems_.size()) {
    return invalid_argument("chunk store: acquire takes chunks " + std::to_string(first_slotted()) + ".." +
                            std::to_string(elems_.size() - 1) + (resident_first_ ? " (chunk 0 is resident)" : "") +
                            ", not " + std::to_string(chunk));
  }
  const AccessSchedule::Use use = schedule_.use(chunk);
  cur_pos_ = use.position;
  cur_chunk_ = chunk;
  if (!use.predicted && issued_ > use.position) {
    // Mispredicted: what was fetched for this position and after is the
    // wrong chunk. Let those copies and reads finish, then fetch again.
    STRATA_RETURN_IF_ERROR(dev_->synchronize(copy_));
    for (size_t p = use.position; p < issued_; ++p) drop_use(p);
    issued_ = use.position;
    if (nvme_) {
      drain_weight_reads();
      weights_read_ = use.position;
    }
  }
  STRATA_RETURN_IF_ERROR(issue_ahead(use.position));
  // The slot's copy event is this use's: no copy replaces a slot that a
  // use not yet released reads.
  const size_t slot = pos_slot_[use.position];
  if (ready != nullptr) {
    *ready = slot_ready_[slot];
  } else {
    STRATA_RETURN_IF_ERROR(meter_->wait(*dev_, slot_ready_[slot], "weights"));
  }
  set_state(chunk, View::kWeights, Residency::kOnDevice);
  return Use{use.position, slots_[slot].data()};
}

Result<ChunkStore::Use> ChunkStore::acquire(size_t chunk) {
  return take(chunk, nullptr);
}

Result<ChunkStore::Use> ChunkStore::acquire_async(size_t chunk, gpu::Event* ready) {
  if (ready == nullptr) return invalid_argument("chunk store: acquire_async needs an event to fill");
  return take(chunk, ready);
}

void ChunkStore::release(const Use& use) { drop_use(use.position); }

Status ChunkStore::release_after(const Use& use, gpu::Event done) {
  const size_t slot = pos_slot_[use.position];
  // Two reads of the slot from the model's streams: the copy stream waits
  // for the older now (the newer is kept for the slot's next copy).
  if (slot_free_[slot].id >= 0 && done.id >= 0) STRATA_RETURN_IF_ERROR(dev_->stream_wait(copy_, slot_free_[slot]));
  if (done.id >= 0) slot_free_[slot] = done;
  drop_use(use.position);
  return ok_status();
}

Result<void*> ChunkStore::embedding_gradient(int micro_batch) {
  if (!resident_first_) return static_cast<void*>(nullptr);  // chunk 0 takes a slot like the rest
  if (micro_batch < 0 || micro_batch >= micro_batches_) {
    return invalid_argument("chunk store: no micro-batch " + std::to_string(micro_batch));
  }
  return static_cast<void*>(resident_grad_.as<uint8_t>() + static_cast<uint64_t>(micro_batch) * bytes_of(0));
}

Result<void*> ChunkStore::gradient_buffer(size_t chunk, int micro_batch) {
  if (chunk >= elems_.size()) return invalid_argument("chunk store: no chunk " + std::to_string(chunk));
  STRATA_ASSIGN_OR_RETURN(void* buffer, embedding_gradient(micro_batch));
  if (chunk >= first_slotted()) {
    const size_t g = next_grad_slot_ % grad_slots_.size();
    if (const std::optional<size_t> held = grad_slot_held_[g]) {
      return resource_exhausted("chunk store: both gradient buffers are taken; send chunk " + std::to_string(*held) +
                                "'s gradient before asking for chunk " + std::to_string(chunk) + "'s buffer");
    }
    ++next_grad_slot_;
    grad_slot_held_[g] = chunk;
    if (grad_slot_done_[g].id >= 0) STRATA_RETURN_IF_ERROR(meter_->wait(*dev_, grad_slot_done_[g], "gradient buffer"));
    grad_slot_done_[g] = gpu::Event{};
    grad_slot_of_[chunk] = g;
    buffer = grad_slots_[g].data();
  }
  set_state(chunk, View::kGradient, Residency::kDirty);
  return buffer;
}

Status ChunkStore::send_gradient(size_t chunk, void* host_dst, int micro_batch) {
  if (chunk >= elems_.size()) return invalid_argument("chunk store: no chunk " + std::to_string(chunk));
  STRATA_ASSIGN_OR_RETURN(const void* src, embedding_gradient(micro_batch));
  if (residency(chunk, View::kGradient) != Residency::kDirty) {
    return failed_precondition("chunk store: chunk " + std::to_string(chunk) + "'s gradient was not computed");
  }
  if (chunk >= first_slotted()) src = grad_slots_[*grad_slot_of_[chunk]].data();
  STRATA_RETURN_IF_ERROR(dev_->copy_to_host(gradient_stream(), host_dst, src, bytes_of(chunk)));
  STRATA_ASSIGN_OR_RETURN(gpu::Event copied, dev_->record(gradient_stream()));
  if (chunk >= first_slotted()) {
    grad_slot_done_[*grad_slot_of_[chunk]] = copied;
    grad_slot_held_[*grad_slot_of_[chunk]].reset();
  }
  d2h_bytes_ += bytes_of(chunk);
  std::lock_guard<std::mutex> lock(mu_);
  grad_copied_[chunk] = copied;
  state_[chunk][static_cast<size_t>(View::kGradient)] = Residency::kCopying;
  return ok_status();
}

Status ChunkStore::await_gradient(size_t chunk) {
  gpu::Event copied;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (chunk >= elems_.size()) return invalid_argument("chunk store: no chunk " + std::to_string(chunk));
    if (state_[chunk][static_cast<size_t>(View::kGradient)] == Residency::kOnHost) return ok_status();
    copied = grad_copied_[chunk];
  }
  if (copied.id < 0) {
    return failed_precondition("chunk store: chunk " + std::to_string(chunk) + "'s gradient was not sent");
  }
  STRATA_RETURN_IF_ERROR(dev_->synchronize(copied));
  // On host — unless the next micro-batch's gradient of the chunk (the
  // vertical order) is already being computed: that state stays.
  std::lock_guard<std::mutex> lock(mu_);
  Residency& now = state_[chunk][static_cast<size_t>(View::kGradient)];
  if (now == Residency::kCopying && grad_copied_[chunk].id == copied.id) now = Residency::kOnHost;
  return ok_status();
}

void ChunkStore::drain() {
  dev_->synchronize(copy_).ignore();
  dev_->synchronize(gradient_stream()).ignore();
  if (nvme_) {
    drain_weight_reads();
    weight_copied_.assign(weight_copied_.size(), gpu::Event{});
  }
  slot_uses_.assign(slots_.size(), 0);
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t c = 0; c < elems_.size(); ++c) {
    // What a slot held is still there, but the next step starts afresh.
    state_[c][static_cast<size_t>(View::kWeights)] = weights_home_state();
    state_[c][static_cast<size_t>(View::kGradient)] = Residency::kOnHost;
  }
}

}  // namespace strata::engine
