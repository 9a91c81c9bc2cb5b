#include "models/gpt/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/units.h"
#include "engine/checkpoint_io.h"
#include "engine/device_pinned_memory.h"
#include "engine/gradient_sum.h"
#include "engine/nvme_store.h"
#include "gpu/device_factory.h"
#include "models/gpt/gpt_init.h"
#include "models/gpt/trainer_checks.h"

namespace strata::engine {
namespace {

// The host backend's staging memory: page-aligned, locked when asked, and
// a refusal says how to turn locking off in the trainer's terms.
class PinnedHostMemory final : public io::BufferAllocator {
 public:
  explicit PinnedHostMemory(bool lock) : inner_(lock), lock_(lock) {}
  Result<io::Buffer> allocate(uint64_t capacity_bytes, uint64_t alignment) override {
    Result<io::Buffer> b = inner_.allocate(capacity_bytes, alignment);
    if (!b && lock_) {
      return std::move(b).error().with_context(
          "locking the trainer's host staging memory (pin_memory: false in the config, TrainerOptions::pin_memory "
          "or strata-train --no-pin-memory turns locking off)");
    }
    return b;
  }

 private:
  io::AlignedAllocator inner_;
  bool lock_;
};

// Appends a buffer of n zeros to `set`, zeroed on the executor's threads.
template <class T>
void zeroed(std::vector<AlignedVector<T>>& set, size_t n, cpu_optim::Executor& ex) {
  set.emplace_back(n);
  ex.zero(set.back().data(), n * sizeof(T));
}

}  // namespace

Result<std::unique_ptr<Trainer>> Trainer::create(const TrainerOptions& o) {
  STRATA_RETURN_IF_ERROR(check_options(o));
  STRATA_RETURN_IF_ERROR(check_resources(o));
  STRATA_RETURN_IF_ERROR(check_budgets(o));
  std::unique_ptr<Trainer> tr(new Trainer());
  if (o.backend == TrainerOptions::Backend::kCuda && o.pin_memory) {
    // Page-locked by the device's driver, so its copies run asynchronously.
    tr->allocator_ = std::make_unique<DevicePinnedMemory>(gpu::Backend::kCuda);
  } else {
    tr->allocator_ = std::make_unique<PinnedHostMemory>(o.pin_memory && o.backend == TrainerOptions::Backend::kHost);
  }
  tr->options_ = o;
  tr->layout_ = gpu::model_layout(o.model);
  tr->landing_order_ = StreamedModel::landing_order(o.model);
  if (o.precision == DType::kF16) {
    STRATA_ASSIGN_OR_RETURN(tr->scaler_, LossScaler::create(o.loss_scale));
  }
  STRATA_ASSIGN_OR_RETURN(tr->executor_, cpu_optim::Executor::create(executor_options(o)));
  if (o.grad_accum > 1) tr->accumulator_ = std::make_unique<SerialQueue>("strata:accum");
  // Everything the trainer allocates from here on — arenas (locked or
  // cudaHostAlloc'ed, their pages faulted in here), states, weights,
  // gradients — takes its pages from that node.
  STRATA_ASSIGN_OR_RETURN(cpu_optim::Executor::NodeMemoryScope on_node, tr->executor_->node_memory_scope());
  std::vector<int64_t> elems;
  for (const auto& chunk : tr->layout_) elems.push_back(chunk.numel);
  // What one staging buffer holds: the largest piece of a chunk's state.
  STRATA_RETURN_IF_ERROR(tr->open_nvme(max_state_piece(elems, o.states == Tier::kNvme ? o.state_piece_elems : 0)));
  STRATA_ASSIGN_OR_RETURN(
      tr->stage_, OptimizerStage::create(elems, o.states, tr->swap_.get(), tr->staging_.get(), *tr->executor_, o.trace,
                                         o.adam_states, o.state_piece_elems));
  if (o.speculate_in_ram) STRATA_RETURN_IF_ERROR(tr->stage_->enable_ram_speculation());
  if (o.gradients == Tier::kNvme) {
    STRATA_RETURN_IF_ERROR(tr->stage_->home_gradients_on_nvme(optimizer_gradient_type(training_setup(o))));
    // Each buffer holds the largest chunk's gradient (or sum), padded for
    // the stage's NVMe writes of its pieces.
    const uint64_t max_chunk = static_cast<uint64_t>(*std::max_element(elems.begin(), elems.end()));
    auto ring = [&](const char* name, uint64_t elem_bytes, std::unique_ptr<PinnedArena>* arena,
                    std::vector<PinnedArena::Lease>* leases) -> Status {
      STRATA_ASSIGN_OR_RETURN(*arena, PinnedArena::create(name, tr->swap_->padded_size(elem_bytes * max_chunk),
                                                          static_cast<uint32_t>(o.gradient_buffers), *tr->allocator_,
                                                          tr->executor_.get()));
      for (int k = 0; k < o.gradient_buffers; ++k) {
        STRATA_ASSIGN_OR_RETURN(PinnedArena::Lease lease, (*arena)->acquire(name));
        leases->push_back(std::move(lease));
      }
      return ok_status();
    };
    STRATA_RETURN_IF_ERROR(ring("gradient ring", 2, &tr->grad_ring_, &tr->ring_));
    if (o.grad_accum > 1) STRATA_RETURN_IF_ERROR(ring("gradient sum ring", 4, &tr->sum_ring_, &tr->sums_));
    tr->landing_position_.assign(tr->layout_.size(), 0);
    for (size_t k = 0; k < tr->landing_order_.size(); ++k) tr->landing_position_[tr->landing_order_[k]] = k;
  }
  STRATA_RETURN_IF_ERROR(tr->build_model());
  STRATA_RETURN_IF_ERROR(tr->place_initial_state(elems));
  if (o.host_budget_bytes > 0 && tr->host_bytes() > o.host_budget_bytes) {
    return resource_exhausted("trainer: its host memory, " + format_bytes(tr->host_bytes()) +
                              " (states, weights, gradients, staging), exceeds the host budget of " +
                              format_bytes(o.host_budget_bytes) +
                              " (budgets.host); raise it, or put the states or weights on NVMe");
  }
  return tr;
}

// One store (one ring) for every NVMe byte, and the optimizer's staging
// arena when the states are there.
Status Trainer::open_nvme(int64_t max_piece) {
  const TrainerOptions& o = options_;
  // The optimizer stage's thread and the compute thread share the store.
  if (o.states == Tier::kNvme || o.activation_checkpoints == Tier::kNvme) {
    STRATA_ASSIGN_OR_RETURN(swap_, io::SwapStore::open(swap_store_options(o)));
  }
  if (o.states == Tier::kNvme) {
    // With the gradients on NVMe, a piece's gradient too.
    const uint64_t grad_bytes =
        o.gradients == Tier::kNvme ? dtype_bytes(optimizer_gradient_type(training_setup(o))) : 0;
    const uint64_t staging_bytes =
        OptimizerStage::staging_bytes(*swap_, max_piece, o.adam_states, o.weights == Tier::kNvme, grad_bytes);
    STRATA_ASSIGN_OR_RETURN(
        staging_, PinnedArena::create("optimizer staging", staging_bytes, static_cast<uint32_t>(o.staging_buffers),
                                      *allocator_, executor_.get()));
  }
  return ok_status();
}

// The device and the streamed model on it, traced when asked, reading its
// weights from NVMe when they live there.
Status Trainer::build_model() {
  const TrainerOptions& o = options_;
  // The device computes in the working weights' type. The resident
  // placement is the streamed model with a slot for every chunk but the
  // resident embedding (L + 1 slots: depth L), each copied up once a step
  // and kept for backward.
  const int depth = o.stream_weights ? o.prefetch_depth : static_cast<int>(o.model.layers);
  gpu::DeviceSpec spec;
  spec.backend = o.backend == TrainerOptions::Backend::kCuda ? gpu::Backend::kCuda : gpu::Backend::kHost;
  spec.capacity_bytes = o.device_bytes;
  spec.compute_threads = o.compute_threads;
  if (Trace* trace = o.trace; trace != nullptr && trace->enabled()) {
    spec.copy_observer = [trace](bool to_device, uint64_t bytes, Trace::Clock::time_point start,
                                 Trace::Clock::time_point end) {
      trace->span("copy stream", to_device ? "host->device" : "device->host", trace->us(start), trace->us(end), "copy",
                  bytes);
    };
  }
  STRATA_ASSIGN_OR_RETURN(device_, gpu::make_device(spec));
  STRATA_ASSIGN_OR_RETURN(
      streamed_,
      StreamedModel::create(o.model, o.batch, o.seq, *device_, depth, o.activation_checkpoints, swap_.get(),
                            allocator_.get(), o.precision, o.states, static_cast<int>(micro_batches_per_pass(o))));
  streamed_->set_trace(o.trace);
  stage_->set_store(&streamed_->store());  // the states' moves, in the store's record
  if (!ring_.empty()) {
    // A chunk's gradient goes into its ring buffer once the stage is done
    // with the chunk that used it last (ring_.size() landings before).
    streamed_->set_gradient_gate([this](size_t c) -> Status {
      const size_t k = landing_position_[c], R = ring_.size();
      return k < R ? ok_status() : stage_->wait_gradients_released(k - R + 1);
    });
  }
  if (o.weights == Tier::kNvme) {
    STRATA_RETURN_IF_ERROR(stage_->home_weights_on_nvme(o.precision));
    OptimizerStage* stage = stage_.get();
    STRATA_RETURN_IF_ERROR(
        streamed_->set_nvme_weights({swap_.get(), [stage](size_t c) { return stage->weights_blobs(c); }}));
  }
  return ok_status();
}

// Each chunk's initial master weights (and states), its working weights on
// the host, its gradient buffers; those the device copies from and to pinned.
Status Trainer::place_initial_state(const std::vector<int64_t>& elems) {
  const TrainerOptions& o = options_;
  // Chunk c's host buffers, each filled on the executor's threads, which
  // fault its pages in (AlignedVector(n) leaves them untouched): the
  // working weights from `master` (null: zeros, for a load), zero gradients.
  auto host_buffers = [&](size_t c, const float* master) -> Status {
    const size_t n = static_cast<size_t>(elems[c]);
    if (o.weights == Tier::kHost) {
      weights_.emplace_back(n);
      if (master != nullptr) {
        STRATA_RETURN_IF_ERROR(
            cpu_optim::convert(master, DType::kF32, weights_[c].data(), o.precision, elems[c], *executor_));
      } else {
        executor_->zero(weights_[c].data(), n * 2);
      }
      if (o.delayed_update) zeroed(weights_next_, n, *executor_);
    }
    if (o.gradients == Tier::kHost) {
      zeroed(grads_, n, *executor_);
      if (o.grad_accum > 1) zeroed(acc_, n, *executor_);
    }
    if (o.delayed_update) {
      if (o.grad_accum > 1) {
        zeroed(acc_alt_, n, *executor_);
      } else {
        zeroed(grads_alt_, n, *executor_);
      }
    }
    return ok_status();
  };
  const auto chunks = static_cast<int64_t>(layout_.size());
  if (!o.initial_state) {
    stage_->leave_unset();
    for (size_t c = 0; c < layout_.size(); ++c) STRATA_RETURN_IF_ERROR(host_buffers(c, nullptr));
    broken_ = "created without initial weights and states (TrainerOptions::initial_state false)";
  } else {
    // One buffer for every chunk's master weights: its pages fault in once.
    // The stage writes states on NVMe behind the next chunk's draws.
    AlignedVector<float> master(static_cast<size_t>(*std::max_element(elems.begin(), elems.end())));
    auto make_chunk = [&](size_t c) -> Result<const float*> {
      if (c > 0) report("initialising", static_cast<int64_t>(c), chunks);
      initial_master(layout_[c], c, o.seed, o.model.layers, *executor_, master.data());
      STRATA_RETURN_IF_ERROR(host_buffers(c, master.data()));
      return static_cast<const float*>(master.data());
    };
    STRATA_RETURN_IF_ERROR(stage_->initialize_all(make_chunk));
    report("initialising", chunks, chunks);
  }
  stale_.assign(weights_.size(), false);
  // What the streamed model copies from and to, pinned for the device
  // (CUDA: asynchronous copies; the host backend: nothing to do).
  for (auto* set : {&weights_, &weights_next_, &grads_, &grads_alt_}) {
    for (AlignedVector<uint16_t>& v : *set) {
      STRATA_ASSIGN_OR_RETURN(gpu::HostPin pin, gpu::HostPin::make(*device_, v.data(), v.size() * 2));
      pins_.push_back(std::move(pin));
    }
  }
  return ok_status();
}

void Trainer::report(std::string_view what, int64_t done, int64_t total) const {
  if (options_.progress) options_.progress(what, done, total);
}

Trainer::~Trainer() {
  if (stage_) stage_->cancel();  // its thread reports to the streamed model's store
  pins_.clear();
  streamed_.reset();  // its device memory goes back before the device
  device_.reset();
  stage_.reset();  // before the staging arena and the swap store it uses
  staging_.reset();
  swap_.reset();
}

uint64_t Trainer::host_bytes() const {
  uint64_t b = 0;
  for (const auto* set : {&weights_, &weights_next_, &grads_, &grads_alt_}) {
    for (const auto& v : *set) b += v.capacity() * 2;
  }
  for (const auto* set : {&acc_, &acc_alt_}) {
    for (const auto& v : *set) b += v.capacity() * 4;
  }
  b += stage_->host_bytes();
  if (staging_) b += staging_->total_bytes();
  if (grad_ring_) b += grad_ring_->total_bytes();
  if (sum_ring_) b += sum_ring_->total_bytes();
  b += streamed_->host_bytes();
  return b;
}

void Trainer::make_batch(int64_t index, std::vector<int32_t>* tokens, std::vector<int32_t>* targets) const {
  synthetic_batch(options_.seed, options_.model.vocab, options_.batch, options_.seq, index, tokens, targets);
}

namespace {
double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

Status Trainer::absorb(Result<OverlapOutcome> outcome) {
  // Delayed: the stage wrote the new weights beside the ones the step
  // computed with; they take their place only when the step updated (not
  // failed, not skipped). Otherwise it wrote them in place, chunk by chunk,
  // and a failed or skipped step takes the old ones back from the master
  // weights it left as they were.
  const bool in_place = weights_in_place();
  if (!outcome) {
    if (in_place) restore_written_weights().ignore();  // what stays stale is put back before the next use
    return std::move(outcome).error();
  }
  // A skipped step's chunks that a speculative update wrote in place get
  // their old weights back first: where that fails, the step fails and
  // nothing of it is taken — not the loss scale's move, not the counts —
  // so that its retry is the step as it would have run (the chunks stay
  // marked and the next step puts them back first).
  if (in_place && outcome->skipped) STRATA_RETURN_IF_ERROR(restore_written_weights());
  last_stage_ = outcome->counters;
  last_grad_norm_ = outcome->grad_norm;
  last_clipped_ = outcome->clipped;
  last_skipped_ = outcome->skipped;
  last_rolled_back_ = outcome->rolled_back;
  if (options_.precision == DType::kF16) scaler_.update(outcome->skipped);
  if (!outcome->skipped) ++updates_;
  rollbacks_ += outcome->rolled_back ? 1 : 0;
  if (!in_place && !last_skipped_) std::swap(weights_, weights_next_);
  return ok_status();
}

Status Trainer::restore_written_weights() { return restore_weights(/*mark_written=*/true); }

Status Trainer::restore_weights(bool mark_written) {
  std::vector<void*> weights;
  for (AlignedVector<uint16_t>& w : weights_) weights.push_back(w.data());
  return stage_->restore_stale_weights(&stale_, weights, options_.precision, mark_written);
}

Status Trainer::read_master(size_t chunk, float* dst) {
  if (chunk >= layout_.size()) {
    return invalid_argument("trainer: read_master: chunk " + std::to_string(chunk) + " of " +
                            std::to_string(layout_.size()));
  }
  STRATA_RETURN_IF_ERROR(flush().with_context("trainer: read_master: the delayed update in flight"));
  return stage_->read_master(chunk, dst);
}

Status Trainer::finalize() {
  STRATA_RETURN_IF_ERROR(flush().with_context("trainer: finalize: the delayed update in flight"));
  return device_->async_error().with_context("trainer: finalize: the device's background work");
}

Status Trainer::async_error() {
  if (update_failed_.load()) {
    return unavailable("trainer: the last delayed update failed; the next step or finalize begins it again");
  }
  if (pending_.load()) return stage_->async_error().with_context("trainer: the delayed update in flight");
  return ok_status();
}

Status Trainer::flush() {
  restart_failed_update();
  if (!pending_) return ok_status();
  pending_ = false;
  Status s = absorb(stage_->finish());
  // Nothing of it was taken (the states' new generation is never switched
  // to, the weights it wrote beside are not swapped in): begun again later.
  update_failed_ = !s.ok();
  return s;
}

void Trainer::restart_failed_update() {
  if (!update_failed_) return;
  update_failed_ = false;
  begin_delayed(std::move(in_flight_));
}

// Starts a delayed update: every chunk's gradient is complete.
void Trainer::begin_delayed(OverlapStep step) {
  in_flight_ = step;
  Status s = stage_->begin(std::move(step));
  STRATA_CHECK_MSG(s.ok(), "trainer: the optimizer stage refused a step: %s", s.to_string().c_str());
  for (size_t c : landing_order_) hand_over(c, false, {});
  pending_ = true;
}

Result<float> Trainer::step() {
  return run_step(nullptr, nullptr);
}

Result<float> Trainer::step(std::span<const int32_t> tokens, std::span<const int32_t> targets) {
  const int64_t V = options_.model.vocab;
  const auto n = static_cast<size_t>(options_.grad_accum * options_.batch * options_.seq);
  if (tokens.size() != n || targets.size() != n) {
    return invalid_argument("trainer step: expected " + std::to_string(n) + " tokens and as many targets (" +
                            std::to_string(options_.grad_accum) + " micro-batches x " + std::to_string(options_.batch) +
                            " sequences x " + std::to_string(options_.seq) + " tokens), got " +
                            std::to_string(tokens.size()) + " and " + std::to_string(targets.size()));
  }
  for (size_t i = 0; i < n; ++i) {
    if (tokens[i] < 0 || tokens[i] >= V || targets[i] < 0 || targets[i] >= V) {
      const bool tok = tokens[i] < 0 || tokens[i] >= V;
      return invalid_argument("trainer step: " + std::string(tok ? "token " : "target ") + std::to_string(i) + " is " +
                              std::to_string(tok ? tokens[i] : targets[i]) + ", outside the vocabulary 0.." +
                              std::to_string(V - 1));
    }
  }
  return run_step(tokens.data(), targets.data());
}

// The optimizer stage's step: Adam at the update count's rate, the
// gradients (as they land, or their fp32 sums), where the new weights go.
OverlapStep Trainer::make_overlap_step(float dloss) {
  const int64_t A = options_.grad_accum;
  OverlapStep ov;
  cpu_optim::AdamConfig adam = options_.adam;
  ov.t = updates_ + 1;  // a skipped step is no update: Adam's t and the schedule stay
  adam.lr = lr_at(options_.lr_schedule, options_.adam.lr, ov.t);
  last_lr_ = adam.lr;
  ov.config = adam;
  for (size_t c = 0; c < layout_.size(); ++c) {
    // The device's gradients as they landed, or their fp32 sum over the micro-batches.
    if (A > 1) {
      ov.grads.push_back({sum_buffer(c), DType::kF32});
    } else {
      ov.grads.push_back({grad_buffer(c), options_.precision});
    }
    // The new weights: in place, or beside the ones the next step computes
    // with (delayed); null: the stage writes them to NVMe.
    ov.out.push_back(!weights_next_.empty() ? weights_next_[c].data()
                                            : (weights_.empty() ? nullptr : weights_[c].data()));
  }
  ov.out_dtype = options_.precision;
  ov.order = landing_order_;
  ov.grad_scale = 1.0f / static_cast<float>(A) / dloss;
  ov.clip_norm = options_.clip_norm;
  // Guess that this step neither clips nor skips when the last one did neither.
  ov.speculate = options_.speculate && !last_clipped_ && !last_skipped_;
  return ov;
}

// Hands chunk c to the stage: with `add_last`, the stage's thread adds the
// last micro-batch into the sum first. The buffers are captured, not the
// trainer's members (a delayed step swaps those while the stage may still
// run).
void Trainer::hand_over(size_t c, bool add_last, std::function<Status()> ready) {
  if (!add_last) return stage_->land(c, std::move(ready));
  stage_->land(c, add_gradient_when(std::move(ready), sum_buffer(c), grad_buffer(c), options_.precision,
                                    static_cast<size_t>(layout_[c].numel), /*first=*/false, *executor_));
}

// Chunk c's gradient, once landed, added into its fp32 sum (or starting it:
// `first`) on the accumulator's thread beside the rest of backward.
void Trainer::sum_later(size_t c, bool first) {
  StreamedModel* model = streamed_.get();
  accumulator_->submit(add_gradient_when([model, c] { return model->await_gradient(c); }, sum_buffer(c), grad_buffer(c),
                                         options_.precision, static_cast<size_t>(layout_[c].numel), first, *executor_));
}

// The NVMe bytes read and written so far, every directory.
void Trainer::nvme_totals(uint64_t* read, uint64_t* written) const {
  *read = *written = 0;
  if (!swap_) return;
  for (const io::DirectoryStats& d : swap_->stats().directories) {
    *read += d.bytes_read;
    *written += d.bytes_written;
  }
}

// The A micro-batches in passes of V through the streamed model: one at a
// time (V = 1), or V together in the vertical order (V divides A). In a
// pass each chunk's gradient lands V times in a row into grads_. The step's
// last landing goes to the stage (unless delayed: then every chunk is
// handed over after backward); with A > 1 every other one is added into the
// fp32 sums on the accumulator's thread, which is drained before the next
// copy into the same buffer and after each pass. The sums' order, and so
// their bits, are the same for any V. Passes after the first compute with
// the same weights: what the last left on the device stays (resident
// weights go up once a step). Returns the sum of the A losses, in
// micro-batch order; the copies and the device's waits go into `counters`.
Result<double> Trainer::passes(const int32_t* data_tokens, const int32_t* data_targets, float dloss,
                               StepCounters& counters) {
  const int64_t A = options_.grad_accum;
  const bool delayed = options_.delayed_update;
  const int64_t V = streamed_->micro_batches(), per = options_.batch * options_.seq;
  // What a pass reads the weights from (empty: they come from NVMe) and
  // writes the gradients to (after a delayed step's swap).
  std::vector<const void*> pass_weights;
  std::vector<void*> pass_grads;
  for (size_t c = 0; c < layout_.size(); ++c) {
    pass_weights.push_back(weights_.empty() ? nullptr : weights_[c].data());
    pass_grads.push_back(grad_buffer(c));
  }
  StreamedModel* model = streamed_.get();
  std::vector<int32_t> tokens, targets;
  double total = 0;
  std::vector<float> losses;
  for (int64_t k0 = 0; k0 < A; k0 += V) {  // the pass's first micro-batch
    const int32_t* tok = data_tokens ? data_tokens + k0 * per : nullptr;
    const int32_t* tgt = data_targets ? data_targets + k0 * per : nullptr;
    if (tok == nullptr) {
      tokens.clear();
      targets.clear();
      std::vector<int32_t> tk, tg;
      for (int64_t k = k0; k < k0 + V; ++k) {
        make_batch(t_ * A + k, &tk, &tg);
        tokens.insert(tokens.end(), tk.begin(), tk.end());
        targets.insert(targets.end(), tg.begin(), tg.end());
      }
      tok = tokens.data();
      tgt = targets.data();
    }
    const uint64_t h2d = streamed_->bytes_to_device(), d2h = streamed_->bytes_to_host();
    auto landed = [&, model](size_t c, int64_t m) {
      const int64_t k = k0 + m;
      if (k == A - 1 && !delayed) {
        hand_over(c, A > 1, [model, c] { return model->await_gradient(c); });
      } else if (A > 1) {
        sum_later(c, k == 0);
      }
    };
    auto before_resend = [this] { return accumulator_->drain(); };
    Status fb = streamed_->forward_backward_pass(pass_weights, tok, tgt, pass_grads, landed, before_resend, dloss,
                                                 &losses, k0 > 0);
    Status summed = accumulator_ ? accumulator_->drain() : ok_status();
    STRATA_RETURN_IF_ERROR(fb);
    STRATA_RETURN_IF_ERROR(summed);
    counters.h2d_bytes += streamed_->bytes_to_device() - h2d;
    counters.d2h_bytes += streamed_->bytes_to_host() - d2h;
    counters.device_wait_s += streamed_->last_wait_seconds();
    for (float l : losses) total += l;
  }
  return total;
}

void Trainer::swap_gradient_sets() {
  if (options_.grad_accum == 1) {
    std::swap(grads_, grads_alt_);
  } else {
    std::swap(acc_, acc_alt_);
  }
}

void Trainer::publish(StepCounters counters, uint64_t nvme_read0, uint64_t nvme_written0) {
  nvme_totals(&counters.nvme_read_bytes, &counters.nvme_written_bytes);
  counters.nvme_read_bytes -= nvme_read0;
  counters.nvme_written_bytes -= nvme_written0;
  counters.device_idle_fraction =
      last_times_.forward_backward > 0 ? counters.device_wait_s / last_times_.forward_backward : 0.0;
  last_counters_ = counters;
}

Result<float> Trainer::run_step(const int32_t* data_tokens, const int32_t* data_targets) {
  if (!broken_.empty()) return failed_precondition("trainer: " + broken_ + "; load a checkpoint to continue");
  STRATA_RETURN_IF_ERROR(restore_weights());  // what a failed step left stale
  auto t0 = std::chrono::steady_clock::now();
  Trace* trace = options_.trace;
  double phase_us = trace ? trace->now_us() : 0;
  const std::string step_name = trace ? "step " + std::to_string(t_ + 1) + ": " : std::string();
  // Closes the current phase on the trainer's track and opens the next.
  auto phase = [&](const char* name) {
    if (!trace) return;
    const double now = trace->now_us();
    trace->span("trainer", step_name + name, phase_us, now, "phase");
    phase_us = now;
  };
  const int64_t A = options_.grad_accum;
  const bool delayed = options_.delayed_update;
  StepCounters counters;  // this step's, published at its end
  // Delayed update: the previous step's stage may still be reading the
  // other set of the buffers it takes its gradients from.
  // A failed one is begun again first, to run beside this step as it would have.
  if (delayed) {
    restart_failed_update();
    swap_gradient_sets();
  }
  // fp16: the loss is scaled, so a scale too large overflows the fp16
  // backward to inf, and the step is skipped.
  const float dloss = options_.precision == DType::kF16 ? static_cast<float>(scaler_.scale()) : 1.0f;
  // Exact schedule: the optimizer stage starts now, on its own thread: it
  // reads states ahead while the forward runs and takes each chunk as its
  // gradient lands. Delayed: it starts after this step's backward and runs
  // beside the next step's forward and backward.
  if (!delayed) STRATA_RETURN_IF_ERROR(stage_->begin(make_overlap_step(dloss)));
  // Any failure from here on: stop the stage (the weights this step
  // computed with are untouched). Delayed: the update in flight goes on
  // reading its gradient set, which the retry's swap leaves alone.
  auto abandon = [&](Status s) -> Status {
    if (delayed) {
      swap_gradient_sets();
      return s;
    }
    stage_->cancel();
    // Chunks the stage had updated in place get their old weights back
    // (what cannot be now, before the next use).
    if (weights_in_place()) restore_written_weights().ignore();
    return s;
  };
  uint64_t nvme_read0 = 0, nvme_written0 = 0;
  nvme_totals(&nvme_read0, &nvme_written0);
  // Each micro-batch's gradient is computed alone and summed in fp32, in
  // order (the same bits in every placement); the 1/A goes into the scale.
  Result<double> sum = passes(data_tokens, data_targets, dloss, counters);
  if (!sum) return abandon(std::move(sum).error());
  const float loss = A == 1 ? static_cast<float>(*sum) : static_cast<float>(*sum / static_cast<double>(A));
  last_times_.forward_backward = seconds_since(t0);
  phase("forward+backward");
  t0 = std::chrono::steady_clock::now();
  if (delayed) {
    // The previous step's update ends here; this step's starts, for the
    // next forward to run beside. A failed update is begun again at the
    // retry of this step (flush keeps it), whose gradients are computed again.
    Status landed = flush();
    if (!landed.ok()) {
      swap_gradient_sets();
      return landed;
    }
    begin_delayed(make_overlap_step(dloss));
  } else {
    STRATA_RETURN_IF_ERROR(absorb(stage_->finish()));
  }
  ++t_;
  last_times_.optimizer = seconds_since(t0);
  publish(counters, nvme_read0, nvme_written0);
  phase(delayed ? "optimizer stage (previous step's)" : "optimizer stage and weights");
  return loss;
}

}  // namespace strata::engine
