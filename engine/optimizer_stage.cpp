#include "engine/optimizer_stage.h"

#include <chrono>
#include <cstring>
#include <optional>

#include "common/units.h"

namespace strata::engine {

Result<std::unique_ptr<OptimizerStage>> OptimizerStage::create(std::vector<int64_t> chunk_elems, Tier tier,
                                                               io::SwapStore* swap, PinnedArena* staging,
                                                               cpu_optim::Executor& executor, Trace* trace) {
  if (chunk_elems.empty()) return invalid_argument("optimizer stage: no chunks");
  if (tier == Tier::kDevice) return invalid_argument("optimizer stage: states live on the host or NVMe");
  int64_t max_elems = 0;
  for (int64_t n : chunk_elems) max_elems = std::max(max_elems, n);
  if (tier == Tier::kNvme) {
    if (swap == nullptr || staging == nullptr) {
      return invalid_argument("optimizer stage: states on NVMe need a swap store and a staging arena");
    }
    uint64_t need = swap->padded_size(state_bytes(max_elems));
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
  if (tier == Tier::kHost) stage->host_.resize(stage->elems_.size());
  return stage;
}

Status OptimizerStage::initialize(size_t c, const float* master) {
  STRATA_CHECK(c < elems_.size());
  const int64_t n = elems_[c];
  if (tier_ == Tier::kHost) {
    host_[c].assign(static_cast<size_t>(3 * n), 0.0f);
    std::memcpy(host_[c].data(), master, static_cast<size_t>(n) * 4);
    return ok_status();
  }
  STRATA_ASSIGN_OR_RETURN(PinnedArena::Lease lease, staging_->acquire("initialise " + blob(c)));
  std::memset(lease.data(), 0, lease.buffer().capacity_bytes);
  std::memcpy(lease.data(), master, static_cast<size_t>(n) * 4);
  STRATA_ASSIGN_OR_RETURN(io::Ticket t, swap_->write(blob(c), lease.buffer(), state_bytes(n)));
  return swap_->wait(t);
}

Status OptimizerStage::read_master(size_t c, float* dst) {
  STRATA_CHECK(c < elems_.size());
  std::vector<float> state(static_cast<size_t>(3 * elems_[c]));
  STRATA_RETURN_IF_ERROR(read_state(c, state.data()));
  std::memcpy(dst, state.data(), static_cast<size_t>(elems_[c]) * 4);
  return ok_status();
}

Status OptimizerStage::read_state(size_t c, float* dst) {
  STRATA_CHECK(c < elems_.size());
  const uint64_t bytes = state_bytes(elems_[c]);
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

Status OptimizerStage::write_state(size_t c, const float* src) {
  STRATA_CHECK(c < elems_.size());
  const uint64_t bytes = state_bytes(elems_[c]);
  if (tier_ == Tier::kHost) {
    host_[c].assign(src, src + 3 * elems_[c]);
    return ok_status();
  }
  STRATA_ASSIGN_OR_RETURN(PinnedArena::Lease lease, staging_->acquire("write " + blob(c)));
  std::memset(lease.data(), 0, lease.buffer().capacity_bytes);
  std::memcpy(lease.data(), src, bytes);
  STRATA_ASSIGN_OR_RETURN(io::Ticket t, swap_->write(blob(c), lease.buffer(), bytes));
  return swap_->wait(t).with_context("writing optimizer state of chunk " + std::to_string(c));
}

cpu_optim::ParamSpan OptimizerStage::span_over(float* state, int64_t n, const ChunkGrad& g, void* out,
                                               DType out_dtype) const {
  cpu_optim::ParamSpan s;
  s.params = state;
  s.n = n;
  s.grad = g.data;
  s.grad_dtype = g.dtype;
  s.weights_out = out;
  s.out_dtype = out_dtype;
  s.state.type = cpu_optim::StateType::kF32;
  s.state.m = state + n;
  s.state.v = state + 2 * n;
  return s;
}

Result<StageCounters> OptimizerStage::step(const cpu_optim::OptimizerConfig& config, int64_t t,
                                           std::span<const ChunkGrad> grads, std::span<void* const> out,
                                           DType out_dtype, const cpu_optim::StepOptions& options) {
  if (grads.size() != elems_.size() || out.size() != elems_.size()) {
    return invalid_argument("optimizer stage: " + std::to_string(elems_.size()) + " chunks, but " +
                            std::to_string(grads.size()) + " gradients and " + std::to_string(out.size()) +
                            " outputs given");
  }
  if (tier_ == Tier::kNvme) return step_nvme(config, t, grads, out, out_dtype, options);
  auto t0 = std::chrono::steady_clock::now();
  StageCounters counters;
  for (size_t c = 0; c < elems_.size(); ++c) {
    STRATA_CHECK_MSG(!host_[c].empty(), "optimizer stage: chunk %zu was never initialised", c);
    double start = trace_ ? trace_->now_us() : 0;
    Result<cpu_optim::StepReport> r =
        cpu_optim::step(config, t, span_over(host_[c].data(), elems_[c], grads[c], out[c], out_dtype), options,
                        *executor_);
    if (!r) return std::move(r).error().with_context("optimizer step of chunk " + std::to_string(c));
    counters.nonfinite += r->nonfinite;
    if (trace_) trace_->span("optimizer", "update chunk " + std::to_string(c), start, trace_->now_us(), "optimizer");
  }
  counters.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return counters;
}

Result<StageCounters> OptimizerStage::step_nvme(const cpu_optim::OptimizerConfig& config, int64_t t,
                                                std::span<const ChunkGrad> grads, std::span<void* const> out,
                                                DType out_dtype, const cpu_optim::StepOptions& options) {
  auto t0 = std::chrono::steady_clock::now();
  const size_t C = elems_.size();
  StageCounters counters;
  std::vector<PinnedArena::Lease> lease(C);
  std::vector<std::optional<io::Ticket>> reads(C), writes(C);
  std::vector<double> issued_us(C, 0);
  // Every issued request is waited for before its buffer's lease can end,
  // on the error path too: the kernel may still be writing into it.
  auto drain = [&]() {
    for (size_t j = 0; j < C; ++j) {
      if (reads[j]) swap_->wait(*reads[j]).ignore();
      if (writes[j]) swap_->wait(*writes[j]).ignore();
      reads[j].reset();
      writes[j].reset();
    }
  };
  auto fail = [&](Status s, const std::string& what) {
    drain();
    return std::move(s).with_context(what);
  };
  auto issue_read = [&](size_t j) -> Status {
    STRATA_ASSIGN_OR_RETURN(lease[j], staging_->acquire("read " + blob(j)));
    STRATA_ASSIGN_OR_RETURN(io::Ticket ticket, swap_->read(blob(j), lease[j].buffer()));
    reads[j] = ticket;
    if (trace_) issued_us[j] = trace_->now_us();
    return ok_status();
  };
  if (Status s = issue_read(0); !s.ok()) return fail(std::move(s), "optimizer state pipeline");
  for (size_t j = 0; j < C; ++j) {
    if (j + 1 < C) {
      // Three buffers: j-1 is being written, j updated, j+1 read; chunk
      // j-2's write must be done before its buffer is reused.
      if (j >= 2 && writes[j - 2]) {
        Status s = swap_->wait(*writes[j - 2]);
        writes[j - 2].reset();
        if (!s.ok()) return fail(std::move(s), "writing optimizer state of chunk " + std::to_string(j - 2));
        lease[j - 2] = PinnedArena::Lease();
      }
      if (Status s = issue_read(j + 1); !s.ok()) return fail(std::move(s), "optimizer state pipeline");
    }
    Status rs = swap_->wait(*reads[j]);
    reads[j].reset();
    if (!rs.ok()) return fail(std::move(rs), "reading optimizer state of chunk " + std::to_string(j));
    counters.nvme_bytes_read += state_bytes(elems_[j]);
    double start = trace_ ? trace_->now_us() : 0;
    if (trace_) trace_->span("nvme", "read chunk " + std::to_string(j), issued_us[j], start, "nvme", state_bytes(elems_[j]));
    auto* state = reinterpret_cast<float*>(lease[j].data());
    Result<cpu_optim::StepReport> r =
        cpu_optim::step(config, t, span_over(state, elems_[j], grads[j], out[j], out_dtype), options, *executor_);
    if (!r) return fail(std::move(r).error(), "optimizer step of chunk " + std::to_string(j));
    counters.nonfinite += r->nonfinite;
    if (trace_) trace_->span("optimizer", "update chunk " + std::to_string(j), start, trace_->now_us(), "optimizer");
    Result<io::Ticket> w = swap_->write(blob(j), lease[j].buffer(), state_bytes(elems_[j]));
    if (!w) return fail(std::move(w).error(), "writing optimizer state of chunk " + std::to_string(j));
    writes[j] = *w;
    counters.nvme_bytes_written += state_bytes(elems_[j]);
  }
  for (size_t j = 0; j < C; ++j) {
    if (!writes[j]) continue;
    Status s = swap_->wait(*writes[j]);
    writes[j].reset();
    if (!s.ok()) return fail(std::move(s), "writing optimizer state of chunk " + std::to_string(j));
  }
  counters.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return counters;
}

}  // namespace strata::engine
