// OptimizerStage's overlapped step (begin / land / finish): the stage's
// thread reads states ahead in the landing order, takes each chunk's
// gradient statistics as it lands, updates speculatively through the NVMe
// pipeline (read ahead, update, write behind; Pipeline), and at the verdict
// switches generations or redoes the step exactly (optimizer_stage.h).
// The rest of the stage — creation, homes, initial state, checkpoint
// access and the serial step — is optimizer_stage.cpp.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <deque>
#include <optional>

#include "common/thread.h"
#include "cpu_optim/executor.h"
#include "engine/optimizer_stage.h"

namespace strata::engine {

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
  if (!step.out_dtypes.empty() && step.out_dtypes.size() != C) {
    return invalid_argument("optimizer stage: " + std::to_string(C) + " chunks, but " +
                            std::to_string(step.out_dtypes.size()) + " output types");
  }
  for (size_t c = 0; weights_nvme_ && c < C; ++c) {
    if (step.out_dtype_of(c) != weights_dtype_) {
      return invalid_argument("optimizer stage: the weights on NVMe are " + std::string(dtype_name(weights_dtype_)));
    }
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
    out = static_cast<std::byte*>(ov_.out[p.chunk]) +
          dtype_bytes(ov_.out_dtype_of(p.chunk)) * static_cast<uint64_t>(p.offset);
    written_[p.chunk] = true;  // before the update: a failing one may have written part of it
  }
  const DType out_dtype = ov_.out_dtype_of(p.chunk);
  cpu_optim::ParamSpan span = span_over(state, p.elems, g, out, out_dtype);
  if (state_next != nullptr) {
    const cpu_optim::ParamSpan next = span_over(state_next, p.elems, g, out, out_dtype);
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
