#include "engine/optimizer_stage.h"

#include <chrono>
#include <cmath>
#include <cstring>
#include <deque>
#include <optional>

#include "common/thread.h"
#include "common/units.h"

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

Result<std::unique_ptr<OptimizerStage>> OptimizerStage::create(std::vector<int64_t> chunk_elems, Tier tier,
                                                               io::SwapStore* swap, PinnedArena* staging,
                                                               cpu_optim::Executor& executor, Trace* trace,
                                                               cpu_optim::StateType states) {
  if (chunk_elems.empty()) return invalid_argument("optimizer stage: no chunks");
  if (tier == Tier::kDevice) return invalid_argument("optimizer stage: states live on the host or NVMe");
  int64_t max_elems = 0;
  for (int64_t n : chunk_elems) max_elems = std::max(max_elems, n);
  if (tier == Tier::kNvme) {
    if (swap == nullptr || staging == nullptr) {
      return invalid_argument("optimizer stage: states on NVMe need a swap store and a staging arena");
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
  stage->tier_ = tier;
  stage->swap_ = swap;
  stage->staging_ = staging;
  stage->executor_ = &executor;
  stage->trace_ = trace;
  stage->state_type_ = states;
  if (tier == Tier::kHost) stage->host_.resize(stage->elems_.size());
  stage->gen_.assign(stage->elems_.size(), 0);
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

Status OptimizerStage::home_weights_on_nvme(DType dtype) {
  if (tier_ != Tier::kNvme) return invalid_argument("optimizer stage: weights on NVMe need the states on NVMe");
  if (dtype != DType::kBF16 && dtype != DType::kF16) {
    return invalid_argument("optimizer stage: working weights on NVMe are bf16 or fp16");
  }
  int64_t max_elems = 0;
  for (int64_t n : elems_) max_elems = std::max(max_elems, n);
  const uint64_t need = staging_bytes_with_weights(*swap_, max_elems, state_type_);
  if (staging_->buffer_bytes() < need) {
    return invalid_argument("optimizer stage: weights on NVMe need staging buffers of " + format_bytes(need) +
                            " (have " + format_bytes(staging_->buffer_bytes()) + ")");
  }
  weights_nvme_ = true;
  weights_dtype_ = dtype;
  return ok_status();
}

Status OptimizerStage::enable_ram_speculation() {
  if (tier_ != Tier::kHost) return failed_precondition("optimizer stage: RAM speculation is for states in RAM");
  next_.resize(elems_.size());
  for (size_t c = 0; c < elems_.size(); ++c) next_[c].assign(state_bytes(elems_[c], state_type_), std::byte{0});
  return ok_status();
}

Status OptimizerStage::initialize(size_t c, const float* master) {
  STRATA_CHECK(c < elems_.size());
  const int64_t n = elems_[c];
  if (tier_ == Tier::kHost) {
    // m = v = 0 (8-bit states: zero codes under zero scales decode to 0).
    host_[c].assign(state_bytes(n, state_type_), std::byte{0});
    std::memcpy(host_[c].data(), master, static_cast<size_t>(n) * 4);
    return ok_status();
  }
  STRATA_ASSIGN_OR_RETURN(PinnedArena::Lease lease, staging_->acquire("initialise " + blob(c)));
  std::memset(lease.data(), 0, lease.buffer().capacity_bytes);
  std::memcpy(lease.data(), master, static_cast<size_t>(n) * 4);
  STRATA_ASSIGN_OR_RETURN(io::Ticket t, swap_->write(blob(c), lease.buffer(), state_bytes(n, state_type_)));
  STRATA_RETURN_IF_ERROR(swap_->wait(t));
  if (!weights_nvme_) return ok_status();
  std::byte* w = lease.data() + weights_offset(c);
  STRATA_RETURN_IF_ERROR(cpu_optim::convert(master, DType::kF32, w, weights_dtype_, n));
  STRATA_ASSIGN_OR_RETURN(io::Ticket tw, swap_->write(weights_blob(c), {w, lease.buffer().capacity_bytes - weights_offset(c)},
                                                      2 * static_cast<uint64_t>(n)));
  return swap_->wait(tw);
}

Status OptimizerStage::read_weights(size_t c, void* dst) {
  STRATA_CHECK(c < elems_.size() && weights_nvme_);
  STRATA_ASSIGN_OR_RETURN(PinnedArena::Lease lease, staging_->acquire("read " + weights_blob(c)));
  STRATA_ASSIGN_OR_RETURN(io::Ticket t, swap_->read(weights_blob(c), lease.buffer()));
  STRATA_RETURN_IF_ERROR(swap_->wait(t).with_context("reading the weights of chunk " + std::to_string(c)));
  std::memcpy(dst, lease.data(), 2 * static_cast<size_t>(elems_[c]));
  return ok_status();
}

Status OptimizerStage::write_weights(size_t c, const void* src) {
  STRATA_CHECK(c < elems_.size() && weights_nvme_);
  STRATA_ASSIGN_OR_RETURN(PinnedArena::Lease lease, staging_->acquire("write " + weights_blob(c)));
  std::memset(lease.data(), 0, lease.buffer().capacity_bytes);
  std::memcpy(lease.data(), src, 2 * static_cast<size_t>(elems_[c]));
  STRATA_ASSIGN_OR_RETURN(io::Ticket t, swap_->write(weights_blob(c), lease.buffer(), 2 * static_cast<uint64_t>(elems_[c])));
  return swap_->wait(t).with_context("writing the weights of chunk " + std::to_string(c));
}

Status OptimizerStage::read_master(size_t c, float* dst) {
  STRATA_CHECK(c < elems_.size());
  std::vector<std::byte> state(state_bytes(elems_[c], state_type_));
  STRATA_RETURN_IF_ERROR(read_state(c, state.data()));
  std::memcpy(dst, state.data(), static_cast<size_t>(elems_[c]) * 4);
  return ok_status();
}

Status OptimizerStage::read_state(size_t c, std::byte* dst) {
  STRATA_CHECK(c < elems_.size());
  const uint64_t bytes = state_bytes(elems_[c], state_type_);
  if (tier_ == Tier::kHost) {
    STRATA_CHECK_MSG(!host_[c].empty(), "optimizer stage: chunk %zu was never initialised", c);
    std::memcpy(dst, host_[c].data(), bytes);
    return ok_status();
  }
  STRATA_ASSIGN_OR_RETURN(PinnedArena::Lease lease, staging_->acquire("read " + blob(c)));
  STRATA_ASSIGN_OR_RETURN(io::Ticket t, swap_->read(blob(c), lease.buffer()));
  STRATA_RETURN_IF_ERROR(swap_->wait(t).with_context("reading optimizer state of chunk " + std::to_string(c)));
  std::memcpy(dst, lease.data(), bytes);
  return ok_status();
}

Status OptimizerStage::write_state(size_t c, const std::byte* src) {
  STRATA_CHECK(c < elems_.size());
  const uint64_t bytes = state_bytes(elems_[c], state_type_);
  if (tier_ == Tier::kHost) {
    host_[c].assign(src, src + bytes);
    return ok_status();
  }
  STRATA_ASSIGN_OR_RETURN(PinnedArena::Lease lease, staging_->acquire("write " + blob(c)));
  std::memset(lease.data(), 0, lease.buffer().capacity_bytes);
  std::memcpy(lease.data(), src, bytes);
  STRATA_ASSIGN_OR_RETURN(io::Ticket t, swap_->write(blob(c), lease.buffer(), bytes));
  return swap_->wait(t).with_context("writing optimizer state of chunk " + std::to_string(c));
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
  if (weights_nvme_) return failed_precondition("optimizer stage: with weights on NVMe, use begin()/finish()");
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
  StageCounters counters;
  if (tier_ == Tier::kNvme) {
    STRATA_ASSIGN_OR_RETURN(counters, update_pass(options, nullptr));
    for (int& g : gen_) g = 1 - g;
  } else {
    for (size_t c = 0; c < elems_.size(); ++c) {
      STRATA_CHECK_MSG(!host_[c].empty(), "optimizer stage: chunk %zu was never initialised", c);
      STRATA_RETURN_IF_ERROR(traced_update(c, host_[c].data(), out[c], options, &counters));
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
  ov_ = std::move(step);
  if (tier_ != Tier::kNvme && next_.empty()) ov_.speculate = false;
  outcome_ = OverlapOutcome{};
  stats_.assign(C, cpu_optim::GradStats{});
  {
    std::lock_guard lock(mu_);
    ready_.assign(C, {});
    landed_.assign(C, false);
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
  return outcome_;
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
  if (ready) STRATA_RETURN_IF_ERROR(ready().with_context("gradient of chunk " + std::to_string(c)));
  double start = trace_ ? trace_->now_us() : 0;
  STRATA_ASSIGN_OR_RETURN(stats_[c], cpu_optim::grad_stats(ov_.grads[c].data, ov_.grads[c].dtype, elems_[c],
                                                           ov_.grad_scale, *executor_));
  if (trace_) trace_->span("optimizer", "gradient stats chunk " + std::to_string(c), start, trace_->now_us(), "optimizer");
  return ok_status();
}

// The NVMe read -> update -> write pipeline over the landing order, with as
// many chunks in flight as the staging arena has buffers. Reads come from
// each chunk's current blob, writes go to its other one.
class OptimizerStage::Pipeline {
 public:
  explicit Pipeline(OptimizerStage& s)
      : s_(s), C_(s.elems_.size()), lease_(C_), reads_(C_), writes_(C_), weight_writes_(C_) {}
  ~Pipeline() { drain(); }

  // Issues reads for landing positions < upto, freeing buffers of finished writes as needed.
  Status fill(size_t upto) {
    upto = std::min(upto, C_);
    while (next_read_ < upto) {
      if (s_.staging_->in_use() >= s_.staging_->capacity()) {
        if (pending_writes_.empty()) break;
        STRATA_RETURN_IF_ERROR(retire_oldest_write());
        continue;
      }
      const size_t c = s_.ov_.order[next_read_];
      const std::string name = blob(c, s_.gen_[c]);
      STRATA_ASSIGN_OR_RETURN(lease_[c], s_.staging_->acquire("read " + name));
      STRATA_ASSIGN_OR_RETURN(io::Ticket t, s_.swap_->read(name, lease_[c].buffer()));
      reads_[c] = t;
      s_.moved(c, Residency::kLoading);
      ++next_read_;
    }
    return ok_status();
  }

  // Updates the chunk at landing position k and issues its write.
  Status update(size_t k, const cpu_optim::StepOptions& options) {
    const size_t c = s_.ov_.order[k];
    STRATA_RETURN_IF_ERROR(fill(k + 1));
    STRATA_CHECK_MSG(reads_[c].has_value(), "optimizer stage: chunk %zu updated before it was read", c);
    const uint64_t bytes = state_bytes(s_.elems_[c], s_.state_type_);
    Status rs = s_.swap_->wait(*reads_[c]);
    reads_[c].reset();
    STRATA_RETURN_IF_ERROR(rs.with_context("reading optimizer state of chunk " + std::to_string(c)));
    counters.nvme_bytes_read += bytes;
    s_.moved(c, Residency::kOnHost);
    const uint64_t woff = s_.weights_nvme_ ? s_.weights_offset(c) : 0;
    void* out = s_.weights_nvme_ ? static_cast<void*>(lease_[c].data() + woff) : s_.ov_.out[c];
    STRATA_RETURN_IF_ERROR(s_.traced_update(c, lease_[c].data(), out, options, &counters));
    s_.moved(c, Residency::kDirty);
    STRATA_ASSIGN_OR_RETURN(io::Ticket w, s_.swap_->write(blob(c, 1 - s_.gen_[c]), lease_[c].buffer(), bytes));
    writes_[c] = w;
    pending_writes_.push_back(c);
    counters.nvme_bytes_written += bytes;
    if (s_.weights_nvme_) {
      const uint64_t wbytes = 2 * static_cast<uint64_t>(s_.elems_[c]);
      io::IoBuffer wbuf{lease_[c].data() + woff, lease_[c].buffer().capacity_bytes - woff};
      STRATA_ASSIGN_OR_RETURN(io::Ticket ww, s_.swap_->write(weights_blob(c, 1 - s_.gen_[c]), wbuf, wbytes));
      weight_writes_[c] = ww;
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
    const size_t c = pending_writes_.front();
    pending_writes_.pop_front();
    Status s = s_.swap_->wait(*writes_[c]);
    writes_[c].reset();
    if (weight_writes_[c]) {
      Status w = s_.swap_->wait(*weight_writes_[c]);
      weight_writes_[c].reset();
      if (s.ok() && !w.ok()) s = std::move(w);
    }
    lease_[c] = PinnedArena::Lease();
    s_.moved(c, Residency::kOnNvme);
    return s.with_context("writing optimizer state of chunk " + std::to_string(c));
  }
  // Every issued request is waited for before its buffer's lease can end,
  // on the error path too: the kernel may still be writing into it.
  void drain() {
    for (size_t c = 0; c < C_; ++c) {
      if (reads_[c]) s_.swap_->wait(*reads_[c]).ignore();
      if (writes_[c]) s_.swap_->wait(*writes_[c]).ignore();
      if (weight_writes_[c]) s_.swap_->wait(*weight_writes_[c]).ignore();
      // A buffer dropped unwritten: the blob on NVMe is what the chunk has.
      if (lease_[c].valid()) s_.moved(c, Residency::kOnNvme);
    }
  }

  OptimizerStage& s_;
  const size_t C_;
  std::vector<PinnedArena::Lease> lease_;
  std::vector<std::optional<io::Ticket>> reads_, writes_, weight_writes_;
  std::deque<size_t> pending_writes_;
  size_t next_read_ = 0;
};

Status OptimizerStage::traced_update(size_t c, std::byte* state, void* out, const cpu_optim::StepOptions& options,
                                     StageCounters* counters, std::byte* state_next) {
  const double start = trace_ ? trace_->now_us() : 0;
  cpu_optim::ParamSpan span = span_over(state, elems_[c], ov_.grads[c], out, ov_.out_dtype);
  if (state_next != nullptr) {
    const cpu_optim::ParamSpan next = span_over(state_next, elems_[c], ov_.grads[c], out, ov_.out_dtype);
    span.params_next = next.params;
    span.state_next = next.state;
  }
  Result<cpu_optim::StepReport> r = cpu_optim::step(ov_.config, ov_.t, span, options, *executor_);
  if (!r) return std::move(r).error().with_context("optimizer step of chunk " + std::to_string(c));
  counters->nonfinite += r->nonfinite;
  if (trace_) trace_->span("optimizer", "update chunk " + std::to_string(c), start, trace_->now_us(), "optimizer");
  return ok_status();
}

Result<StageCounters> OptimizerStage::update_pass(const cpu_optim::StepOptions& options, Pipeline* prefetched) {
  std::optional<Pipeline> fresh;
  Pipeline* pipe = prefetched;
  if (pipe == nullptr) pipe = &fresh.emplace(*this);
  const size_t ahead = staging_->capacity() - 1;  // one buffer for the write behind
  for (size_t k = 0; k < elems_.size(); ++k) {
    STRATA_RETURN_IF_ERROR(pipe->fill(k + ahead));
    STRATA_RETURN_IF_ERROR(pipe->update(k, options));
  }
  STRATA_RETURN_IF_ERROR(pipe->finish_writes());
  return pipe->counters;
}

namespace {
cpu_optim::StepOptions scaled(float grad_scale) {
  cpu_optim::StepOptions o;
  o.nonfinite = cpu_optim::NonFinitePolicy::kReportOnly;  // the verdict is taken over the whole model
  o.grad_scale = grad_scale;
  return o;
}
}  // namespace

Status OptimizerStage::run_overlap() {
  auto t0 = std::chrono::steady_clock::now();
  idle_s_ = 0;
  const size_t C = elems_.size();
  const bool nvme = tier_ == Tier::kNvme;
  // Staging buffers: one for the write behind, the rest read ahead.
  const size_t ahead = nvme ? staging_->capacity() - 1 : 0;
  std::optional<Pipeline> pipe;
  if (nvme) pipe.emplace(*this);
  if (ov_.speculate && nvme) {
    for (size_t k = 0; k < C; ++k) {
      STRATA_RETURN_IF_ERROR(pipe->fill(k + ahead));
      STRATA_RETURN_IF_ERROR(wait_landed(ov_.order[k]));
      STRATA_RETURN_IF_ERROR(pipe->update(k, scaled(ov_.grad_scale)));
    }
    STRATA_RETURN_IF_ERROR(pipe->finish_writes());
  } else if (ov_.speculate) {
    // In RAM: each chunk's update goes into its second copy; the first stays
    // as it was until the verdict.
    for (size_t c : ov_.order) {
      STRATA_RETURN_IF_ERROR(wait_landed(c));
      STRATA_RETURN_IF_ERROR(
          traced_update(c, host_[c].data(), ov_.out[c], scaled(ov_.grad_scale), &outcome_.counters, next_[c].data()));
    }
  } else {
    if (nvme) STRATA_RETURN_IF_ERROR(pipe->fill(ahead));
    for (size_t k = 0; k < C; ++k) STRATA_RETURN_IF_ERROR(wait_landed(ov_.order[k]));
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
      for (size_t c : ov_.order) {
        STRATA_RETURN_IF_ERROR(traced_update(c, host_[c].data(), ov_.out[c], scaled(scale), &o.counters));
      }
    }
  }
  if (pipe) {
    o.counters.nvme_bytes_read += pipe->counters.nvme_bytes_read;
    o.counters.nvme_bytes_written += pipe->counters.nvme_bytes_written;
    o.counters.nonfinite += pipe->counters.nonfinite;
    pipe.reset();
  }
  // Every chunk now holds its new state in its other blob: switch to it.
  if (nvme && !o.skipped) {
    for (size_t c = 0; c < C; ++c) gen_[c] = 1 - gen_[c];
  }
  // In RAM, a confirmed guess: the second copies become the states.
  if (!nvme && guess_held) {
    for (size_t c = 0; c < C; ++c) host_[c].swap(next_[c]);
  }
  o.out_written = !weights_nvme_ && (!o.skipped || ov_.speculate);
  o.counters.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() - idle_s_;
  return ok_status();
}

}  // namespace strata::engine
