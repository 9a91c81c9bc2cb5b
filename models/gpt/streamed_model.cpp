#include "models/gpt/streamed_model.h"

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
                                                             gpu::Device& dev, int prefetch_depth, Tier checkpoints,
                                                             io::SwapStore* swap, io::BufferAllocator* host_memory,
                                                             DType dtype, Tier states, int micro_batches) {
  STRATA_RETURN_IF_ERROR(c.validate());
  if (dtype != DType::kF32 && dtype != DType::kBF16 && dtype != DType::kF16) {
    return invalid_argument("streamed model: computes in fp32, bf16 or fp16");
  }
  if (prefetch_depth < 1 || prefetch_depth > 1024) return invalid_argument("prefetch depth must be 1..1024");
  if (micro_batches < 1 || micro_batches > 4096) return invalid_argument("micro-batches per pass must be 1..4096");
  if (checkpoints == Tier::kNvme && swap == nullptr) {
    return invalid_argument("activation checkpoints on NVMe need a swap store (NVMe directories)");
  }
  std::unique_ptr<StreamedModel> m(new StreamedModel());
  m->config_ = c;
  m->B_ = B;
  m->T_ = seq;
  m->micro_batches_ = micro_batches;
  const int64_t V = micro_batches;
  m->dev_ = &dev;
  m->checkpoint_tier_ = checkpoints;
  m->dtype_ = dtype;
  m->es_ = dtype_bytes(dtype);
  const uint64_t es = m->es_;
  if (host_memory != nullptr) m->allocator_ = host_memory;
  m->layout_ = gpu::model_layout(c);
  const int64_t L = c.layers, N = B * seq, C = c.hidden;
  STRATA_ASSIGN_OR_RETURN(m->copy_, dev.create_stream("copy"));
  ChunkStoreOptions so;
  so.prefetch_depth = prefetch_depth;
  so.dtype = dtype;
  so.states = states;
  so.host_memory = host_memory;
  so.micro_batches = micro_batches;
  STRATA_ASSIGN_OR_RETURN(m->store_, ChunkStore::create(m->layout_, dev, m->copy_, &m->meter_, so));
  // The compute: the device's model ops on their own stream, with one
  // block's working set and the head's (the workspace) from the budget.
  STRATA_ASSIGN_OR_RETURN(m->ops_, dev.model_ops(c, dtype));
  STRATA_ASSIGN_OR_RETURN(m->compute_, dev.create_stream("compute"));
  STRATA_ASSIGN_OR_RETURN(m->workspace_, m->ops_->workspace(B, seq));
  // Block input l of a pass is V micro-batches' [N,C] inputs side by side
  // (one copy, one blob); on the device all L + 1 of them, or
  // kCheckpointBuffers in flight when they live on the host or NVMe.
  const bool on_device = checkpoints == Tier::kDevice;
  STRATA_ASSIGN_OR_RETURN(m->checkpoints_, elements(dev, (on_device ? L + 1 : kCheckpointBuffers) * V * N * C, es,
                                                    "block-input checkpoints"));
  const uint64_t group_bytes = static_cast<uint64_t>(V * N * C) * es;
  if (checkpoints == Tier::kHost) {
    m->host_checkpoints_.assign(static_cast<size_t>(L + 1) * group_bytes, 0);
    STRATA_ASSIGN_OR_RETURN(m->checkpoint_pin_, gpu::HostPin::make(dev, m->host_checkpoints_.data(),
                                                                  m->host_checkpoints_.size()));
  }
  if (checkpoints == Tier::kNvme) {
    m->swap_ = swap;
    for (int64_t l = 0; l <= L; ++l) m->checkpoint_blobs_.push_back("activation-checkpoint/x-" + std::to_string(l));
    STRATA_ASSIGN_OR_RETURN(m->staging_, PinnedArena::create("activation checkpoint staging",
                                                             swap->padded_size(group_bytes), 2,
                                                             *m->allocator_));
    for (int i = 0; i < 2; ++i) {
      STRATA_ASSIGN_OR_RETURN(PinnedArena::Lease lease, m->staging_->acquire("activation checkpoints"));
      m->stage_buf_.push_back(std::move(lease));
    }
  }
  // Per micro-batch of the pass: dx and dx_in [N,C] (2 * N * C * es bytes:
  // a multiple of 4); then the losses (fp32), the tokens and the targets
  // (int32).
  STRATA_ASSIGN_OR_RETURN(
      m->step_mem_, dev.allocate(static_cast<uint64_t>(V * 2 * N * C) * es + static_cast<uint64_t>(V * (1 + 2 * N)) * 4,
                                 "block gradients, loss and tokens"));
  return m;
}

StreamedModel::~StreamedModel() {
  if (dev_ != nullptr) {
    dev_->synchronize(compute_).ignore();
    dev_->synchronize(copy_).ignore();
  }
  for (auto& t : stage_write_) {
    if (t) swap_->wait(*t).ignore();
  }
  for (auto& t : stage_read_) {
    if (t) swap_->wait(*t).ignore();
  }
}

uint64_t StreamedModel::host_bytes() const {
  uint64_t b = host_checkpoints_.capacity() + store_->host_bytes();
  if (staging_) b += staging_->total_bytes();
  return b;
}

Status StreamedModel::run(const std::function<Status()>& enqueue) {
  // Waits even when enqueueing failed part way: what was enqueued must not
  // outlive this call.
  Status queued = enqueue();
  Status done = dev_->synchronize(compute_);
  STRATA_RETURN_IF_ERROR(queued);
  return done;
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
  store_->settle();
  dev_->async_error().ignore();
}

Result<float> StreamedModel::forward_backward(const std::vector<const void*>& weights, const int32_t* tokens,
                                              const int32_t* targets, const std::vector<void*>& grads,
                                              const GradLanded& landed, float dloss, bool same_weights) {
  if (micro_batches_ != 1) {
    return failed_precondition("streamed model: made for passes of " + std::to_string(micro_batches_) +
                               " micro-batches; use forward_backward_pass");
  }
  MicroBatchLanded each;
  if (landed) each = [&landed](size_t chunk, int64_t) { landed(chunk); };
  std::vector<float> losses;
  STRATA_RETURN_IF_ERROR(
      forward_backward_pass(weights, tokens, targets, grads, each, {}, dloss, &losses, same_weights));
  return losses.front();
}

Status StreamedModel::forward_backward_pass(const std::vector<const void*>& weights, const int32_t* tokens,
                                            const int32_t* targets, const std::vector<void*>& grads,
                                            const MicroBatchLanded& landed,
                                            const std::function<Status()>& before_resend, float dloss,
                                            std::vector<float>* losses, bool same_weights) {
  if (weights.size() != layout_.size() || grads.size() != layout_.size()) {
    return invalid_argument("streamed model: expected " + std::to_string(layout_.size()) + " chunks");
  }
  losses->assign(static_cast<size_t>(micro_batches_), 0.0f);
  Status s = run_step(weights, tokens, targets, grads, landed, before_resend, dloss, losses->data(), same_weights);
  // A failed pass leaves nothing in flight: its copies, compute, checkpoint
  // I/O and weight reads are waited for here, and the device's leftover
  // asynchronous errors (the pass already reported its own) are cleared.
  if (!s.ok()) settle();
  return s;
}

// Off the device, block input l lives in device buffer l % K while in use
// (K = kCheckpointBuffers); the last K stay there from forward to backward.
// Micro-batch m's block input l.
uint8_t* StreamedModel::block_input(int64_t m, int64_t l) const {
  const bool off_device = checkpoint_tier_ != Tier::kDevice;
  const int64_t slot = off_device ? l % kCheckpointBuffers : l;
  return checkpoints_.as<uint8_t>() + static_cast<uint64_t>(slot * micro_batches_ + m) * block_input_bytes();
}

uint64_t StreamedModel::block_input_bytes() const {
  return static_cast<uint64_t>(B_ * T_ * config_.hidden) * es_;
}

// Block input l of the pass: the micro-batches' inputs side by side, moved
// to and from the host or NVMe as one.
uint64_t StreamedModel::input_group_bytes() const {
  return static_cast<uint64_t>(micro_batches_) * block_input_bytes();
}

bool StreamedModel::moves_input(int64_t l) const {
  return checkpoint_tier_ != Tier::kDevice && l >= 0 && l <= config_.layers - kCheckpointBuffers;
}

// Before block input l is written into its device buffer, the buffer's
// previous copy (out to the host, or in from it) must have finished.
Status StreamedModel::claim_input(int64_t l) {
  gpu::Event& e = ckpt_done_[l % kCheckpointBuffers];
  if (checkpoint_tier_ != Tier::kDevice && e.id >= 0) STRATA_RETURN_IF_ERROR(wait_for(e, "checkpoint buffer"));
  return ok_status();
}

// Frees NVMe staging buffer l % 2: its last copy, and the write it fed.
Status StreamedModel::drain_staging(int64_t l) {
  // The copy stream issues the write: its event first, then the ticket.
  if (stage_done_[l % 2].id >= 0) STRATA_RETURN_IF_ERROR(wait_for(stage_done_[l % 2], "checkpoint staging"));
  std::optional<io::Ticket>& pending = stage_write_[l % 2];
  if (!pending) return ok_status();
  Status w = swap_->wait(*pending);
  pending.reset();
  return w;
}

// Sends block input l to the host (the last K stay on the device for backward).
Status StreamedModel::offload_input(int64_t l) {
  if (!moves_input(l)) return ok_status();
  const uint64_t bytes = input_group_bytes();
  const int64_t k = l % kCheckpointBuffers;
  if (checkpoint_tier_ == Tier::kNvme) {
    // Device -> staging buffer on the copy stream, then, on that stream
    // too, the staging buffer's write to NVMe is issued: the compute never
    // waits for the copy. The buffer is reused only after that write ends
    // (drain_staging, after the stream's event says the write was issued).
    STRATA_RETURN_IF_ERROR(drain_staging(l));
    PinnedArena::Lease& buf = stage_buf_[static_cast<size_t>(l % 2)];
    STRATA_RETURN_IF_ERROR(dev_->copy_to_host(copy_, buf.data(), block_input(0, l), bytes));
    std::optional<io::Ticket>* pending = &stage_write_[l % 2];
    io::SwapStore* swap = swap_;
    const std::string* name = &checkpoint_blobs_[static_cast<size_t>(l)];
    STRATA_RETURN_IF_ERROR(dev_->enqueue(copy_, [swap, pending, name, io = buf.buffer(), bytes]() -> Status {
      Result<io::Ticket> t = swap->write(*name, io, bytes);
      if (!t) return std::move(t).error().with_context("writing an activation checkpoint");
      *pending = *t;
      return ok_status();
    }));
    STRATA_ASSIGN_OR_RETURN(ckpt_done_[k], dev_->record(copy_));
    stage_done_[l % 2] = ckpt_done_[k];
  } else {
    uint8_t* dst = host_checkpoints_.data() + static_cast<uint64_t>(l) * bytes;
    STRATA_RETURN_IF_ERROR(dev_->copy_to_host(copy_, dst, block_input(0, l), bytes));
    STRATA_ASSIGN_OR_RETURN(ckpt_done_[k], dev_->record(copy_));
  }
  d2h_bytes_ += bytes;
  return ok_status();
}

// Brings block input l back into its device buffer: fetch_input(l) at the
// top of backward's block l + K, which leaves the copy two blocks' compute
// to finish in. On NVMe, input l's read is issued one block earlier still
// (start_input_read) into a staging buffer.
Status StreamedModel::start_input_read(int64_t l) {
  if (checkpoint_tier_ != Tier::kNvme || !moves_input(l)) return ok_status();
  STRATA_RETURN_IF_ERROR(drain_staging(l));
  STRATA_ASSIGN_OR_RETURN(stage_read_[l % 2], swap_->read(checkpoint_blobs_[static_cast<size_t>(l)],
                                                          stage_buf_[static_cast<size_t>(l % 2)].buffer()));
  return ok_status();
}

Status StreamedModel::fetch_input(int64_t l) {
  if (!moves_input(l)) return ok_status();
  const uint64_t bytes = input_group_bytes();
  const bool nvme = checkpoint_tier_ == Tier::kNvme;
  const uint8_t* src = host_checkpoints_.data() + (nvme ? 0 : static_cast<uint64_t>(l) * bytes);
  if (nvme) {
    const double t0 = WaitMeter::now_s();
    Status rs = swap_->wait(*stage_read_[l % 2]);
    stage_read_[l % 2].reset();
    meter_.note(t0, "checkpoint from nvme");
    STRATA_RETURN_IF_ERROR(rs);
    src = reinterpret_cast<const uint8_t*>(stage_buf_[static_cast<size_t>(l % 2)].data());
  }
  STRATA_RETURN_IF_ERROR(claim_input(l));  // block l + K's input, used by the block before, is done with
  STRATA_RETURN_IF_ERROR(dev_->copy_to_device(copy_, block_input(0, l), src, bytes));
  const int64_t k = l % kCheckpointBuffers;
  STRATA_ASSIGN_OR_RETURN(ckpt_done_[k], dev_->record(copy_));
  if (nvme) stage_done_[l % 2] = ckpt_done_[k];
  h2d_bytes_ += bytes;
  return ok_status();
}

// The chunk's gradient, zeroed then computed by `compute` into a gradient
// slot, sent to its host buffer (micro-batch by micro-batch into the same
// host buffer: the caller is done with the previous one before the next
// copy is issued).
Status StreamedModel::send_gradient(Pass& p, size_t chunk, int64_t m,
                                    const std::function<Status(void* slot)>& compute) {
  STRATA_ASSIGN_OR_RETURN(void* slot, store_->gradient_buffer(chunk));
  const uint64_t bytes = static_cast<uint64_t>(layout_[chunk].numel) * es_;
  auto zeroed_then_computed = [&]() -> Status {
    STRATA_RETURN_IF_ERROR(ops_->zero(compute_, slot, bytes));
    return compute(slot);
  };
  STRATA_RETURN_IF_ERROR(run(zeroed_then_computed));
  if (m > 0 && *p.before_resend) STRATA_RETURN_IF_ERROR((*p.before_resend)());
  if (gate_) STRATA_RETURN_IF_ERROR(gate_(chunk));
  STRATA_RETURN_IF_ERROR(store_->send_gradient(chunk, (*p.grads)[chunk]));
  if (*p.landed) (*p.landed)(chunk, m);
  return ok_status();
}

Status StreamedModel::run_step(const std::vector<const void*>& weights, const int32_t* tokens, const int32_t* targets,
                               const std::vector<void*>& grads, const MicroBatchLanded& landed,
                               const std::function<Status()>& before_resend, float dloss, float* losses,
                               bool same_weights) {
  const int64_t mbs = micro_batches_, N = B_ * T_;
  meter_.reset();
  // Chunk 0's copy (none for the same weights again), and the first uses once recorded.
  STRATA_RETURN_IF_ERROR(store_->begin_step(weights, same_weights));
  for (gpu::Event& e : ckpt_done_) e = gpu::Event{};
  for (gpu::Event& e : stage_done_) e = gpu::Event{};
  // Per micro-batch: dx and dx_in, swapped block by block; the losses,
  // tokens and targets after all of them.
  Pass p{&grads, &landed, &before_resend, dloss};
  const uint64_t x_bytes = block_input_bytes();
  for (int64_t m = 0; m < mbs; ++m) {
    p.dx.push_back(step_mem_.as<uint8_t>() + static_cast<uint64_t>(2 * m) * x_bytes);
    p.dx_in.push_back(p.dx.back() + x_bytes);
  }
  p.loss = reinterpret_cast<float*>(step_mem_.as<uint8_t>() + static_cast<uint64_t>(2 * mbs) * x_bytes);
  p.tokens = reinterpret_cast<int32_t*>(p.loss + mbs);
  p.targets = p.tokens + mbs * N;
  const uint64_t token_bytes = static_cast<uint64_t>(mbs * N) * 4;
  STRATA_RETURN_IF_ERROR(dev_->copy_to_device(compute_, p.tokens, tokens, token_bytes));
  STRATA_RETURN_IF_ERROR(dev_->copy_to_device(compute_, p.targets, targets, token_bytes));
  // The embedding chunk is used at both ends: it stays resident for the step.
  STRATA_ASSIGN_OR_RETURN(p.emb, store_->resident_weights());
  STRATA_RETURN_IF_ERROR(forward_blocks(p));
  STRATA_RETURN_IF_ERROR(head_backward(p));
  for (int64_t l = config_.layers; l >= 1; --l) STRATA_RETURN_IF_ERROR(backward_block(p, l));
  STRATA_RETURN_IF_ERROR(embedding_backward(p));
  STRATA_RETURN_IF_ERROR(dev_->copy_to_host(compute_, losses, p.loss, static_cast<uint64_t>(mbs) * 4));
  STRATA_RETURN_IF_ERROR(dev_->synchronize(compute_));
  STRATA_RETURN_IF_ERROR(dev_->synchronize(copy_));
  STRATA_RETURN_IF_ERROR(dev_->async_error());
  store_->end_step();  // a complete step's uses: what later steps prefetch by
  return ok_status();
}

// The embedding, then every block, keeping only each block's input; with
// one micro-batch the head's forward too.
Status StreamedModel::forward_blocks(Pass& p) {
  const int64_t mbs = micro_batches_, N = B_ * T_, L = config_.layers;
  gpu::ModelOps& ops = *ops_;
  gpu::ModelOps::Workspace& ws = *workspace_;
  auto embed = [&]() -> Status {
    for (int64_t m = 0; m < mbs; ++m) {
      STRATA_RETURN_IF_ERROR(ops.embedding_forward(compute_, ws, p.emb, p.tokens + m * N, block_input(m, 0)));
    }
    return ok_status();
  };
  STRATA_RETURN_IF_ERROR(run(embed));
  STRATA_RETURN_IF_ERROR(offload_input(0));
  for (int64_t l = 1; l <= L; ++l) {
    STRATA_ASSIGN_OR_RETURN(const ChunkStore::Use w, store_->acquire(static_cast<size_t>(l)));
    STRATA_RETURN_IF_ERROR(claim_input(l));
    const double start = meter_.trace() ? meter_.trace()->now_us() : 0;
    auto forward = [&]() -> Status {
      for (int64_t m = 0; m < mbs; ++m) {
        STRATA_RETURN_IF_ERROR(ops.block_forward(compute_, ws, w.data, block_input(m, l - 1), block_input(m, l)));
      }
      return ok_status();
    };
    STRATA_RETURN_IF_ERROR(run(forward));
    if (Trace* t = meter_.trace()) t->span("compute", "forward block " + std::to_string(l), start, t->now_us(), "compute");
    store_->release(w);
    STRATA_RETURN_IF_ERROR(offload_input(l));
  }
  // The head's forward leaves what its backward reads in the workspace: one
  // micro-batch runs it here; several run each micro-batch's forward right
  // before its backward (head_backward).
  if (mbs == 1) {
    STRATA_ASSIGN_OR_RETURN(const ChunkStore::Use w, store_->acquire(static_cast<size_t>(L + 1)));
    STRATA_RETURN_IF_ERROR(
        run([&] { return ops.head_forward(compute_, ws, w.data, p.emb, block_input(0, L), p.targets, p.loss); }));
    store_->release(w);
  }
  return ok_status();
}

// The head's backward, micro-batch by micro-batch. The embeddings' gradient
// (tied: the head adds to it) is complete only after the embedding's
// backward: one buffer per micro-batch, taken here.
Status StreamedModel::head_backward(Pass& p) {
  const int64_t mbs = micro_batches_, N = B_ * T_, L = config_.layers;
  const uint64_t x_bytes = block_input_bytes();
  gpu::ModelOps& ops = *ops_;
  gpu::ModelOps::Workspace& ws = *workspace_;
  for (int64_t m = 0; m < mbs; ++m) {
    STRATA_ASSIGN_OR_RETURN(void* g, store_->gradient_buffer(0, static_cast<int>(m)));
    p.emb_grad.push_back(g);
  }
  STRATA_RETURN_IF_ERROR(start_input_read(L - kCheckpointBuffers));
  const size_t final_chunk = static_cast<size_t>(L + 1);
  STRATA_ASSIGN_OR_RETURN(const ChunkStore::Use w, store_->acquire(final_chunk));
  for (int64_t m = 0; m < mbs; ++m) {
    const size_t u = static_cast<size_t>(m);
    if (mbs > 1) {
      STRATA_RETURN_IF_ERROR(run([&] {
        return ops.head_forward(compute_, ws, w.data, p.emb, block_input(m, L), p.targets + m * N, p.loss + m);
      }));
    }
    auto backward = [&](void* dp) -> Status {
      STRATA_RETURN_IF_ERROR(ops.zero(compute_, p.emb_grad[u], static_cast<uint64_t>(layout_[0].numel) * es_));
      STRATA_RETURN_IF_ERROR(ops.zero(compute_, p.dx[u], 2 * x_bytes));  // dx, dx_in
      return ops.head_backward(compute_, ws, w.data, dp, p.emb, p.emb_grad[u], block_input(m, L), p.targets + m * N,
                               p.dloss, p.dx[u]);
    };
    STRATA_RETURN_IF_ERROR(send_gradient(p, final_chunk, m, backward));
  }
  store_->release(w);
  return ok_status();
}

// Block l's backward: its input back from the host or NVMe (and the next
// ones' started), its forward recomputed from it, its gradient sent.
Status StreamedModel::backward_block(Pass& p, int64_t l) {
  constexpr int64_t K = kCheckpointBuffers;
  const uint64_t x_bytes = block_input_bytes();
  STRATA_RETURN_IF_ERROR(fetch_input(l - K));
  STRATA_RETURN_IF_ERROR(start_input_read(l - K - 1));
  STRATA_ASSIGN_OR_RETURN(const ChunkStore::Use w, store_->acquire(static_cast<size_t>(l)));
  if (checkpoint_tier_ != Tier::kDevice && ckpt_done_[(l - 1) % K].id >= 0) {
    STRATA_RETURN_IF_ERROR(wait_for(ckpt_done_[(l - 1) % K], "checkpoint"));
  }
  gpu::ModelOps& ops = *ops_;
  gpu::ModelOps::Workspace& ws = *workspace_;
  const double start = meter_.trace() ? meter_.trace()->now_us() : 0;
  for (int64_t m = 0; m < micro_batches_; ++m) {
    const size_t u = static_cast<size_t>(m);
    // Recompute the block's forward from its checkpoint (output discarded into dx_in).
    auto recompute = [&]() -> Status {
      STRATA_RETURN_IF_ERROR(ops.block_forward(compute_, ws, w.data, block_input(m, l - 1), p.dx_in[u]));
      return ops.zero(compute_, p.dx_in[u], x_bytes);
    };
    STRATA_RETURN_IF_ERROR(run(recompute));
    STRATA_RETURN_IF_ERROR(send_gradient(p, static_cast<size_t>(l), m, [&](void* dp) {
      return ops.block_backward(compute_, ws, w.data, dp, block_input(m, l - 1), p.dx[u], p.dx_in[u]);
    }));
    std::swap(p.dx[u], p.dx_in[u]);
  }
  if (Trace* t = meter_.trace()) {
    t->span("compute", "recompute+backward block " + std::to_string(l), start, t->now_us(), "compute");
  }
  store_->release(w);
  return ok_status();
}

// The embedding's backward completes chunk 0's gradient, micro-batch by
// micro-batch, each sent from the buffer head_backward took for it.
Status StreamedModel::embedding_backward(Pass& p) {
  const int64_t N = B_ * T_;
  for (int64_t m = 0; m < micro_batches_; ++m) {
    const size_t u = static_cast<size_t>(m);
    STRATA_RETURN_IF_ERROR(
        run([&] { return ops_->embedding_backward(compute_, *workspace_, p.emb_grad[u], p.tokens + m * N, p.dx[u]); }));
    if (m > 0) {
      if (*p.before_resend) STRATA_RETURN_IF_ERROR((*p.before_resend)());
      // Marks chunk 0's gradient computed again (its buffer for m was
      // taken at the top of backward; the view tracks the last send).
      STRATA_RETURN_IF_ERROR(store_->gradient_buffer(0, static_cast<int>(m)).status());
    }
    if (gate_) STRATA_RETURN_IF_ERROR(gate_(0));
    STRATA_RETURN_IF_ERROR(store_->send_gradient(0, (*p.grads)[0], static_cast<int>(m)));
    if (*p.landed) (*p.landed)(0, m);
  }
  return ok_status();
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
