#include "engine/streamed_model.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "common/dtype.h"

namespace strata::engine {
namespace {

// n elements of `bytes_each` from the device's budget.
Result<gpu::DeviceMemory> elements(gpu::Device& dev, int64_t n, uint64_t bytes_each, const char* what) {
  return dev.allocate(static_cast<uint64_t>(n) * bytes_each, what);
}

}  // namespace

Result<std::unique_ptr<StreamedModel>> StreamedModel::create(const gpu::GptConfig& c, int64_t B, int64_t seq,
                                                             gpu::Device& dev, int prefetch_depth,
                                                             Tier checkpoints, io::SwapStore* swap,
                                                             io::BufferAllocator* host_memory, DType dtype) {
  STRATA_RETURN_IF_ERROR(c.validate());
  if (dtype != DType::kF32 && dtype != DType::kBF16 && dtype != DType::kF16) {
    return invalid_argument("streamed model: computes in fp32, bf16 or fp16");
  }
  if (prefetch_depth < 1 || prefetch_depth > 1024) return invalid_argument("prefetch depth must be 1..1024");
  if (checkpoints == Tier::kNvme && swap == nullptr) {
    return invalid_argument("activation checkpoints on NVMe need a swap store (NVMe directories)");
  }
  std::unique_ptr<StreamedModel> m(new StreamedModel());
  m->config_ = c;
  m->B_ = B;
  m->T_ = seq;
  m->dev_ = &dev;
  m->depth_ = prefetch_depth;
  m->checkpoint_tier_ = checkpoints;
  m->dtype_ = dtype;
  m->es_ = dtype_bytes(dtype);
  const uint64_t es = m->es_;
  if (host_memory != nullptr) m->allocator_ = host_memory;
  m->layout_ = gpu::model_layout(c);
  const int64_t L = c.layers, N = B * seq, C = c.hidden;
  int64_t max_chunk = 0;
  for (size_t i = 1; i < m->layout_.size(); ++i) max_chunk = std::max(max_chunk, m->layout_[i].numel);
  STRATA_ASSIGN_OR_RETURN(m->copy_, dev.create_stream("copy"));
  for (int s = 0; s <= prefetch_depth; ++s) {
    STRATA_ASSIGN_OR_RETURN(gpu::DeviceMemory slot, elements(dev, max_chunk, es, "weight chunk buffer"));
    m->slots_.push_back(std::move(slot));
  }
  for (int s = 0; s < 2; ++s) {
    STRATA_ASSIGN_OR_RETURN(gpu::DeviceMemory slot, elements(dev, max_chunk, es, "gradient chunk buffer"));
    m->grad_slots_.push_back(std::move(slot));
    m->grad_done_.push_back(gpu::Event{});
  }
  STRATA_ASSIGN_OR_RETURN(m->embedding_, elements(dev, m->layout_[0].numel, es, "embedding weights"));
  STRATA_ASSIGN_OR_RETURN(m->embedding_grad_, elements(dev, m->layout_[0].numel, es, "embedding gradients"));
  // The compute: the device's model ops on their own stream, with one
  // block's working set and the head's (the workspace) from the budget.
  STRATA_ASSIGN_OR_RETURN(m->ops_, dev.model_ops(c, dtype));
  STRATA_ASSIGN_OR_RETURN(m->compute_, dev.create_stream("compute"));
  STRATA_ASSIGN_OR_RETURN(m->workspace_, m->ops_->workspace(B, seq));
  const bool on_device = checkpoints == Tier::kDevice;
  STRATA_ASSIGN_OR_RETURN(m->checkpoints_, elements(dev, (on_device ? L + 1 : kCheckpointBuffers) * N * C, es, "block-input checkpoints"));
  if (checkpoints == Tier::kHost) {
    m->host_checkpoints_.assign(static_cast<size_t>((L + 1) * N * C) * es, 0);
    STRATA_ASSIGN_OR_RETURN(m->checkpoint_pin_, gpu::HostPin::make(dev, m->host_checkpoints_.data(),
                                                                  m->host_checkpoints_.size()));
  }
  if (checkpoints == Tier::kNvme) {
    m->swap_ = swap;
    STRATA_ASSIGN_OR_RETURN(m->staging_, PinnedArena::create("activation checkpoint staging",
                                                             swap->padded_size(static_cast<uint64_t>(N * C) * es), 2,
                                                             *m->allocator_));
    for (int i = 0; i < 2; ++i) {
      STRATA_ASSIGN_OR_RETURN(PinnedArena::Lease lease, m->staging_->acquire("activation checkpoints"));
      m->stage_buf_.push_back(std::move(lease));
    }
  }
  // dx and dx_in [N,C] (2 * N * C * es bytes: a multiple of 4), the loss
  // (fp32), then the tokens and targets (int32).
  STRATA_ASSIGN_OR_RETURN(m->step_mem_, dev.allocate(static_cast<uint64_t>(2 * N * C) * es +
                                                         static_cast<uint64_t>(1 + 2 * N) * 4,
                                                     "block gradients, loss and tokens"));
  return m;
}

StreamedModel::~StreamedModel() {
  if (dev_ != nullptr) {
    dev_->synchronize(compute_).ignore();
    dev_->synchronize(copy_).ignore();
  }
  drain_weight_reads();
  for (auto& t : stage_write_) {
    if (t) swap_->wait(*t).ignore();
  }
  for (auto& t : stage_read_) {
    if (t) swap_->wait(*t).ignore();
  }
}

Status StreamedModel::set_nvme_weights(NvmeWeights source) {
  if (source.swap == nullptr || !source.blob) return invalid_argument("streamed model: NVMe weights need a store");
  int64_t max_all = 0;
  for (const gpu::ChunkLayout& chunk : layout_) max_all = std::max(max_all, chunk.numel);
  const int ring = depth_ + 3;
  STRATA_ASSIGN_OR_RETURN(weight_arena_, PinnedArena::create("weight staging",
                                                             source.swap->padded_size(es_ * static_cast<uint64_t>(max_all)),
                                                             static_cast<uint32_t>(ring), *allocator_));
  weight_buf_.clear();
  weight_read_.assign(static_cast<size_t>(ring), std::nullopt);
  weight_copied_.assign(static_cast<size_t>(ring), gpu::Event{});
  for (int i = 0; i < ring; ++i) {
    STRATA_ASSIGN_OR_RETURN(PinnedArena::Lease lease, weight_arena_->acquire("weight staging"));
    weight_buf_.push_back(std::move(lease));
  }
  nvme_weights_ = std::move(source);
  return ok_status();
}

uint64_t StreamedModel::host_bytes() const {
  uint64_t b = host_checkpoints_.capacity();
  if (staging_) b += staging_->total_bytes();
  if (weight_arena_) b += weight_arena_->total_bytes();
  return b;
}

void StreamedModel::drain_weight_reads() {
  for (auto& t : weight_read_) {
    if (t) nvme_weights_->swap->wait(*t).ignore();
    t.reset();
  }
}

std::optional<size_t> StreamedModel::chunk_at(size_t pos) const {
  if (pos == cur_pos_) return cur_chunk_;
  if (schedule_.known(pos)) return schedule_.chunk_at(pos);
  return std::nullopt;
}

Status StreamedModel::read_weights_ahead(size_t through) {
  while (weights_read_ <= through) {
    const size_t pos = weights_read_;
    const std::optional<size_t> chunk = chunk_at(pos);
    if (!chunk) break;  // not known yet: read when it is used
    const size_t ring = weight_buf_.size();
    std::optional<io::Ticket>& slot = weight_read_[pos % ring];
    STRATA_CHECK_MSG(!slot.has_value(), "streamed model: weight staging slot %zu still busy", pos % ring);
    // The buffer's last copy to the device reads it until done.
    if (gpu::Event& copied = weight_copied_[pos % ring]; copied.id >= 0) {
      STRATA_RETURN_IF_ERROR(wait_for(copied, "weight staging"));
      copied = gpu::Event{};
    }
    STRATA_ASSIGN_OR_RETURN(io::Ticket t, nvme_weights_->swap->read(nvme_weights_->blob(*chunk),
                                                                    weight_buf_[pos % ring].buffer()));
    slot = t;
    ++weights_read_;
  }
  return ok_status();
}

Result<const void*> StreamedModel::stage_nvme_weights(size_t pos, size_t chunk) {
  // The whole ring ahead: while this chunk is copied, the next depth + 2
  // known uses are on their way from NVMe.
  const size_t ring = weight_buf_.size();
  STRATA_RETURN_IF_ERROR(read_weights_ahead(pos + ring - 1));
  std::optional<io::Ticket>& slot = weight_read_[pos % ring];
  STRATA_CHECK_MSG(slot.has_value(), "streamed model: no read issued for position %zu", pos);
  const double t0 = now_s();
  Status s = nvme_weights_->swap->wait(*slot);
  note_wait(t0, "weights from nvme");
  slot.reset();
  STRATA_RETURN_IF_ERROR(s.with_context("reading the weights of chunk " + std::to_string(chunk)));
  return static_cast<const void*>(weight_buf_[pos % ring].data());
}

size_t StreamedModel::next_use(size_t chunk, size_t after) const {
  for (size_t p = after + 1; schedule_.known(p); ++p) {
    if (schedule_.chunk_at(p) == chunk) return p;
  }
  return kNoPosition;  // not used again as far as the schedule knows
}

Status StreamedModel::issue_ahead(size_t current) {
  // The weight slots hold chunks, not positions: a use whose chunk is still
  // in a slot (the final chunk at the turn, the last blocks of forward again
  // at the start of backward) takes it without a copy. Otherwise the copy
  // goes into a slot no pending use holds (slot_uses_: each issued use
  // takes a reference on its slot and drops it once computed), the one
  // whose chunk is used again farthest ahead (Belady's choice: the order is
  // known).
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
      if (nvme_weights_) {
        // Every earlier position was read (staged) or skipped (a hit) in order.
        STRATA_CHECK_MSG(weights_read_ >= pos, "streamed model: position %zu's read was passed over", pos);
        if (weights_read_ == pos) {
          weights_read_ = pos + 1;  // not read yet: it never will be
        } else {
          // Already read ahead by position: let it land unused.
          std::optional<io::Ticket>& t = weight_read_[pos % weight_buf_.size()];
          if (t) {
            Status s = nvme_weights_->swap->wait(*t);
            t.reset();
            STRATA_RETURN_IF_ERROR(s.with_context("reading the weights of chunk " + std::to_string(*chunk)));
          }
        }
      }
      ++slot_hits_;
    } else {
      size_t farthest = 0;
      for (size_t k = 0; k < slots_.size(); ++k) {
        if (slot_uses_[k] > 0) continue;  // a use still to be computed reads it
        const size_t next = slot_chunk_[k] ? next_use(*slot_chunk_[k], pos) : kNoPosition;
        if (slot == kNoPosition || next > farthest) {
          slot = k;
          farthest = next;
        }
        if (next == kNoPosition) break;  // empty, or not needed again: nothing is better
      }
      STRATA_CHECK_MSG(slot != kNoPosition, "streamed model: no free weight slot for position %zu", pos);
      const uint64_t bytes = static_cast<uint64_t>(layout_[*chunk].numel) * es_;
      const void* src = host_weights_[*chunk];
      if (nvme_weights_) {
        STRATA_ASSIGN_OR_RETURN(src, stage_nvme_weights(pos, *chunk));
      }
      STRATA_RETURN_IF_ERROR(dev_->copy_to_device(copy_, slots_[slot].data(), src, bytes));
      STRATA_ASSIGN_OR_RETURN(slot_ready_[slot], dev_->record(copy_));
      if (nvme_weights_) weight_copied_[pos % weight_buf_.size()] = slot_ready_[slot];
      slot_chunk_[slot] = *chunk;
      h2d_bytes_ += bytes;
    }
    pos_slot_[pos] = slot;
    ++slot_uses_[slot];
    ++issued_;
  }
  return ok_status();
}

Status StreamedModel::run(const std::function<Status()>& enqueue) {
  // Waits even when enqueueing failed part way: what was enqueued must not
  // outlive this call.
  Status queued = enqueue();
  Status done = dev_->synchronize(compute_);
  STRATA_RETURN_IF_ERROR(queued);
  return done;
}

Status StreamedModel::wait_for(gpu::Event e, const char* what) {
  const double t0 = now_s();
  Status s = dev_->synchronize(e);
  note_wait(t0, what);
  return s;
}

double StreamedModel::now_s() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void StreamedModel::note_wait(double t0, const char* what) {
  const double waited = now_s() - t0;
  wait_s_ += waited;
  if (trace_ != nullptr && waited > 20e-6) {
    const double end = trace_->now_us();
    trace_->span("compute", std::string("wait: ") + what, end - waited * 1e6, end, "wait");
  }
}

void StreamedModel::drop_use(size_t pos) {
  const size_t slot = pos_slot_[pos];
  STRATA_CHECK_MSG(slot_uses_[slot] > 0, "streamed model: position %zu's slot %zu has no use to drop", pos, slot);
  --slot_uses_[slot];
}

Result<const void*> StreamedModel::weights_for(size_t chunk) {
  // Compute is synchronous: the previous use is done with its slot.
  if (cur_pos_ != kNoPosition) drop_use(cur_pos_);
  const AccessSchedule::Use use = schedule_.use(chunk);
  cur_pos_ = use.position;
  cur_chunk_ = chunk;
  if (!use.predicted && issued_ > use.position) {
    // Mispredicted: what was fetched for this position and after is the
    // wrong chunk. Let those copies and reads finish, then fetch again.
    STRATA_RETURN_IF_ERROR(dev_->synchronize(copy_));
    for (size_t p = use.position; p < issued_; ++p) drop_use(p);
    issued_ = use.position;
    if (nvme_weights_) {
      drain_weight_reads();
      weights_read_ = use.position;
    }
  }
  STRATA_RETURN_IF_ERROR(issue_ahead(use.position));
  // The slot's copy event is this use's: no copy replaces a slot that an
  // issued use still to be computed reads.
  STRATA_RETURN_IF_ERROR(wait_for(slot_ready_[pos_slot_[use.position]], "weights"));
  return static_cast<const void*>(slots_[pos_slot_[use.position]].data());
}

void StreamedModel::settle() {
  dev_->synchronize(compute_).ignore();
  dev_->synchronize(copy_).ignore();
  for (auto* pending : {&stage_read_, &stage_write_}) {
    for (auto& t : *pending) {
      if (t) swap_->wait(*t).ignore();
      t.reset();
    }
  }
  if (nvme_weights_) {
    drain_weight_reads();
    weight_copied_.assign(weight_copied_.size(), gpu::Event{});
  }
  dev_->async_error().ignore();
}

Result<float> StreamedModel::forward_backward(const std::vector<const void*>& weights, const int32_t* tokens,
                                             const int32_t* targets, const std::vector<void*>& grads,
                                             const GradLanded& landed, float dloss) {
  if (weights.size() != layout_.size() || grads.size() != layout_.size()) {
    return invalid_argument("streamed model: expected " + std::to_string(layout_.size()) + " chunks");
  }
  Result<float> loss = run_step(weights, tokens, targets, grads, landed, dloss);
  // A failed step leaves nothing in flight: its copies, compute, checkpoint
  // I/O and weight reads are waited for here, and the device's leftover
  // asynchronous errors (the step already reported its own) are cleared.
  if (!loss) settle();
  return loss;
}

Result<float> StreamedModel::run_step(const std::vector<const void*>& weights, const int32_t* tokens,
                                      const int32_t* targets, const std::vector<void*>& grads,
                                      const GradLanded& landed, float dloss) {
  const gpu::GptConfig& c = config_;
  const int64_t L = c.layers, N = B_ * T_, C = c.hidden;
  host_weights_ = weights;
  issued_ = 0;
  wait_s_ = 0;
  weights_read_ = 0;
  // The weights change between steps: nothing in a slot carries over.
  slot_chunk_.assign(slots_.size(), std::nullopt);
  slot_uses_.assign(slots_.size(), 0);
  slot_ready_.assign(slots_.size(), gpu::Event{});
  pos_slot_.clear();
  slot_hits_ = 0;
  schedule_.begin_step();
  cur_pos_ = kNoPosition;
  const gpu::ChunkLayout& emb = layout_[0];
  const uint64_t es = es_;
  const uint64_t emb_bytes = static_cast<uint64_t>(emb.numel) * es;
  uint8_t* ckpt = checkpoints_.as<uint8_t>();
  const bool host_ckpt = checkpoint_tier_ != Tier::kDevice;  // off the device: host or NVMe
  const bool nvme_ckpt = checkpoint_tier_ == Tier::kNvme;
  auto blob = [](int64_t l) { return "activation-checkpoint/x-" + std::to_string(l); };
  // Off the device, block input l lives in device buffer l % K while in use;
  // the last K stay there from forward to backward.
  constexpr int64_t K = kCheckpointBuffers;
  const uint64_t x_bytes = static_cast<uint64_t>(N * C) * es;
  auto x_of = [&](int64_t l) { return ckpt + static_cast<uint64_t>(host_ckpt ? l % K : l) * x_bytes; };
  for (gpu::Event& e : ckpt_done_) e = gpu::Event{};
  for (gpu::Event& e : stage_done_) e = gpu::Event{};
  // Before block input l is written into its device buffer, the buffer's
  // previous copy (out to the host, or in from it) must have finished.
  auto claim = [&](int64_t l) -> Status {
    gpu::Event& e = ckpt_done_[l % K];
    if (host_ckpt && e.id >= 0) STRATA_RETURN_IF_ERROR(wait_for(e, "checkpoint buffer"));
    return ok_status();
  };
  // Frees NVMe staging buffer l % 2: its last copy, and the write it fed.
  auto drain_staging = [&](int64_t l) -> Status {
    // The copy stream issues the write: its event first, then the ticket.
    if (stage_done_[l % 2].id >= 0) STRATA_RETURN_IF_ERROR(wait_for(stage_done_[l % 2], "checkpoint staging"));
    std::optional<io::Ticket>& pending = stage_write_[l % 2];
    if (!pending) return ok_status();
    Status w = swap_->wait(*pending);
    pending.reset();
    return w;
  };
  // Sends block input l to the host (the last K stay on the device for backward).
  auto offload = [&](int64_t l) -> Status {
    if (!host_ckpt || l > L - K) return ok_status();
    if (nvme_ckpt) {
      // Device -> staging buffer on the copy stream, then, on that stream
      // too, the staging buffer's write to NVMe is issued: the compute never
      // waits for the copy. The buffer is reused only after that write ends
      // (drain_staging, after the stream's event says the write was issued).
      STRATA_RETURN_IF_ERROR(drain_staging(l));
      PinnedArena::Lease& buf = stage_buf_[static_cast<size_t>(l % 2)];
      STRATA_RETURN_IF_ERROR(dev_->copy_to_host(copy_, buf.data(), x_of(l), x_bytes));
      std::optional<io::Ticket>* pending = &stage_write_[l % 2];
      io::SwapStore* swap = swap_;
      STRATA_RETURN_IF_ERROR(dev_->enqueue(copy_, [swap, pending, name = blob(l), io = buf.buffer(), x_bytes]() -> Status {
        Result<io::Ticket> t = swap->write(name, io, x_bytes);
        if (!t) return std::move(t).error().with_context("writing an activation checkpoint");
        *pending = *t;
        return ok_status();
      }));
      STRATA_ASSIGN_OR_RETURN(ckpt_done_[l % K], dev_->record(copy_));
      stage_done_[l % 2] = ckpt_done_[l % K];
    } else {
      STRATA_RETURN_IF_ERROR(dev_->copy_to_host(copy_, host_checkpoints_.data() + static_cast<uint64_t>(l) * x_bytes, x_of(l), x_bytes));
      STRATA_ASSIGN_OR_RETURN(ckpt_done_[l % K], dev_->record(copy_));
    }
    d2h_bytes_ += x_bytes;
    return ok_status();
  };
  // Brings block input l back into its device buffer: fetch(l) at the top
  // of backward's block l + K, which leaves the copy two blocks' compute to
  // finish in. On NVMe, input l's read is issued one block earlier still
  // (fetch_start) into a staging buffer.
  auto fetch_start = [&](int64_t l) -> Status {
    if (!nvme_ckpt || l < 0 || l > L - K) return ok_status();
    STRATA_RETURN_IF_ERROR(drain_staging(l));
    STRATA_ASSIGN_OR_RETURN(stage_read_[l % 2], swap_->read(blob(l), stage_buf_[static_cast<size_t>(l % 2)].buffer()));
    return ok_status();
  };
  auto fetch = [&](int64_t l) -> Status {
    if (!host_ckpt || l < 0 || l > L - K) return ok_status();
    const uint8_t* src = host_checkpoints_.data() + (nvme_ckpt ? 0 : static_cast<uint64_t>(l) * x_bytes);
    if (nvme_ckpt) {
      const double t0 = now_s();
      Status rs = swap_->wait(*stage_read_[l % 2]);
      stage_read_[l % 2].reset();
      note_wait(t0, "checkpoint from nvme");
      STRATA_RETURN_IF_ERROR(rs);
      src = reinterpret_cast<const uint8_t*>(stage_buf_[static_cast<size_t>(l % 2)].data());
    }
    STRATA_RETURN_IF_ERROR(claim(l));  // block l + K's input, used by the block before, is done with
    STRATA_RETURN_IF_ERROR(dev_->copy_to_device(copy_, x_of(l), src, x_bytes));
    STRATA_ASSIGN_OR_RETURN(ckpt_done_[l % K], dev_->record(copy_));
    if (nvme_ckpt) stage_done_[l % 2] = ckpt_done_[l % K];
    h2d_bytes_ += x_bytes;
    return ok_status();
  };
  uint8_t* dx = step_mem_.as<uint8_t>();
  uint8_t* dx_in = dx + x_bytes;
  float* loss_dev = reinterpret_cast<float*>(dx_in + x_bytes);
  int32_t* tokens_dev = reinterpret_cast<int32_t*>(loss_dev + 1);
  int32_t* targets_dev = tokens_dev + N;
  gpu::ModelOps& ops = *ops_;
  gpu::ModelOps::Workspace& ws = *workspace_;

  // The embedding chunk is used at both ends: it stays resident for the step.
  const void* emb_src = weights[0];
  if (nvme_weights_) {
    // Read into the ring's first buffer, which position 0's read waits to
    // reuse until this copy is done.
    STRATA_ASSIGN_OR_RETURN(io::Ticket t, nvme_weights_->swap->read(nvme_weights_->blob(0), weight_buf_[0].buffer()));
    STRATA_RETURN_IF_ERROR(nvme_weights_->swap->wait(t).with_context("reading the weights of chunk 0"));
    emb_src = weight_buf_[0].data();
  }
  STRATA_RETURN_IF_ERROR(dev_->copy_to_device(copy_, embedding_.data(), emb_src, emb_bytes));
  STRATA_ASSIGN_OR_RETURN(gpu::Event emb_ready, dev_->record(copy_));
  if (nvme_weights_) weight_copied_[0] = emb_ready;
  h2d_bytes_ += emb_bytes;
  STRATA_RETURN_IF_ERROR(issue_ahead(0));  // the first uses on their way (once recorded)
  STRATA_RETURN_IF_ERROR(dev_->copy_to_device(compute_, tokens_dev, tokens, static_cast<uint64_t>(N) * 4));
  STRATA_RETURN_IF_ERROR(dev_->copy_to_device(compute_, targets_dev, targets, static_cast<uint64_t>(N) * 4));
  STRATA_RETURN_IF_ERROR(wait_for(emb_ready, "embedding"));
  STRATA_RETURN_IF_ERROR(run([&] { return ops.embedding_forward(compute_, ws, embedding_.data(), tokens_dev, x_of(0)); }));
  STRATA_RETURN_IF_ERROR(offload(0));

  // Forward: keep only each block's input.
  for (int64_t l = 1; l <= L; ++l) {
    STRATA_ASSIGN_OR_RETURN(const void* p, weights_for(static_cast<size_t>(l)));
    STRATA_RETURN_IF_ERROR(claim(l));
    const double start = trace_ ? trace_->now_us() : 0;
    STRATA_RETURN_IF_ERROR(run([&] { return ops.block_forward(compute_, ws, p, x_of(l - 1), x_of(l)); }));
    if (trace_) trace_->span("compute", "forward block " + std::to_string(l), start, trace_->now_us(), "compute");
    STRATA_RETURN_IF_ERROR(offload(l));
  }
  STRATA_ASSIGN_OR_RETURN(const void* pf, weights_for(static_cast<size_t>(L + 1)));
  STRATA_RETURN_IF_ERROR(
      run([&] { return ops.head_forward(compute_, ws, pf, embedding_.data(), x_of(L), targets_dev, loss_dev); }));

  // Backward.
  size_t next_grad = 0;
  // Each chunk's gradient goes to the host as soon as it is complete.
  auto send_grad = [&](size_t chunk, auto&& compute) -> Status {
    const size_t g = next_grad++ % grad_slots_.size();
    if (grad_done_[g].id >= 0) STRATA_RETURN_IF_ERROR(wait_for(grad_done_[g], "gradient buffer"));
    void* slot = grad_slots_[g].data();
    const uint64_t bytes = static_cast<uint64_t>(layout_[chunk].numel) * es;
    auto zeroed_then_computed = [&]() -> Status {
      STRATA_RETURN_IF_ERROR(ops.zero(compute_, slot, bytes));
      return compute(slot);
    };
    STRATA_RETURN_IF_ERROR(run(zeroed_then_computed));
    STRATA_RETURN_IF_ERROR(dev_->copy_to_host(copy_, grads[chunk], slot, bytes));
    STRATA_ASSIGN_OR_RETURN(grad_done_[g], dev_->record(copy_));
    d2h_bytes_ += bytes;
    if (landed) landed(chunk, grad_done_[g]);
    return ok_status();
  };
  STRATA_ASSIGN_OR_RETURN(const void* pb, weights_for(static_cast<size_t>(L + 1)));
  auto head_backward = [&](void* dp) -> Status {
    STRATA_RETURN_IF_ERROR(ops.zero(compute_, embedding_grad_.data(), embedding_grad_.bytes()));
    STRATA_RETURN_IF_ERROR(ops.zero(compute_, dx, 2 * x_bytes));  // dx, dx_in
    return ops.head_backward(compute_, ws, pb, dp, embedding_.data(), embedding_grad_.data(), x_of(L), targets_dev,
                             dloss, dx);
  };
  STRATA_RETURN_IF_ERROR(fetch_start(L - K));
  STRATA_RETURN_IF_ERROR(send_grad(layout_.size() - 1, head_backward));
  for (int64_t l = L; l >= 1; --l) {
    STRATA_RETURN_IF_ERROR(fetch(l - K));
    STRATA_RETURN_IF_ERROR(fetch_start(l - K - 1));
    STRATA_ASSIGN_OR_RETURN(const void* p, weights_for(static_cast<size_t>(l)));
    if (host_ckpt && ckpt_done_[(l - 1) % K].id >= 0) {
      STRATA_RETURN_IF_ERROR(wait_for(ckpt_done_[(l - 1) % K], "checkpoint"));
    }
    // Recompute the block's forward from its checkpoint (output discarded into dx_in).
    const double start = trace_ ? trace_->now_us() : 0;
    auto recompute = [&]() -> Status {
      STRATA_RETURN_IF_ERROR(ops.block_forward(compute_, ws, p, x_of(l - 1), dx_in));
      return ops.zero(compute_, dx_in, x_bytes);
    };
    STRATA_RETURN_IF_ERROR(run(recompute));
    STRATA_RETURN_IF_ERROR(send_grad(static_cast<size_t>(l), [&](void* dp) {
      return ops.block_backward(compute_, ws, p, dp, x_of(l - 1), dx, dx_in);
    }));
    if (trace_) {
      trace_->span("compute", "recompute+backward block " + std::to_string(l), start, trace_->now_us(), "compute");
    }
    std::swap(dx, dx_in);
  }
  STRATA_RETURN_IF_ERROR(
      run([&] { return ops.embedding_backward(compute_, ws, embedding_grad_.data(), tokens_dev, dx); }));
  STRATA_RETURN_IF_ERROR(dev_->copy_to_host(copy_, grads[0], embedding_grad_.data(), emb_bytes));
  d2h_bytes_ += emb_bytes;
  STRATA_ASSIGN_OR_RETURN(gpu::Event emb_copied, dev_->record(copy_));
  if (landed) landed(0, emb_copied);
  float loss = 0;
  STRATA_RETURN_IF_ERROR(dev_->copy_to_host(compute_, &loss, loss_dev, 4));
  STRATA_RETURN_IF_ERROR(dev_->synchronize(compute_));
  STRATA_RETURN_IF_ERROR(dev_->synchronize(copy_));
  STRATA_RETURN_IF_ERROR(dev_->async_error());
  schedule_.end_step();  // a complete step's uses: what later steps prefetch by
  return loss;
}

std::vector<size_t> StreamedModel::landing_order(const gpu::GptConfig& config) {
  // The final layer norm, the blocks from last to first, the embeddings.
  std::vector<size_t> order;
  const size_t L = static_cast<size_t>(config.layers);
  for (size_t c = L + 1; c > 0; --c) order.push_back(c);
  order.push_back(0);
  return order;
}

}  // namespace strata::engine
