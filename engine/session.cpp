#include "engine/session.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "common/dtype.h"
#include "common/units.h"
#include "engine/device_pinned_memory.h"
#include "engine/host_count.h"
#include "engine/lr_schedule.h"
#include "engine/nvme_store.h"
#include "gpu/device_info.h"

namespace strata::engine {

TrainSetup session_setup(const SessionOptions& o) {
  TrainSetup s;
  s.compute = s.working = o.precision;
  s.grad_accum = o.grad_accum;
  s.delayed_update = o.delayed_update;
  s.micro_batches_per_pass = o.grad_accum;
  s.state_bytes_per_param = cpu_optim::adam_state_bytes_per_param(o.adam_states);
  s.state_piece_elems = o.state_piece_elems;
  s.gradient_buffers = o.gradient_buffers;
  s.host_backend = o.backend == gpu::Backend::kHost;
  return s;
}

Placement session_placement(const SessionOptions& o) {
  Placement pl;
  pl.weights = o.weights;
  pl.states = o.states;
  pl.activations = o.activations;
  pl.prefetch_depth = o.prefetch_depth;
  pl.speculate_in_ram = o.speculate_in_ram;
  pl.micro_batches_per_pass = o.grad_accum;
  pl.gradients = o.gradients;
  return pl;
}

Status check_session_options(const SessionOptions& o) {
  STRATA_RETURN_IF_ERROR(cpu_optim::validate(o.adam));
  STRATA_RETURN_IF_ERROR(validate(o.lr_schedule).with_context("lr_schedule"));
  if (o.precision != DType::kBF16 && o.precision != DType::kF16 && o.precision != DType::kF32) {
    return invalid_argument("the working weights (precision) are bf16, fp16 or fp32");
  }
  if (o.grad_accum < 1 || o.grad_accum > 4096) {
    return invalid_argument("grad_accum (micro-batches per step) must be 1..4096, got " + std::to_string(o.grad_accum));
  }
  // A session's model keeps no weights on the device between uses: they
  // wait on the host or on NVMe, as do the activations it hands over.
  if (o.weights != Tier::kHost && o.weights != Tier::kNvme) {
    return invalid_argument("the working weights live on the host or on NVMe between uses");
  }
  if (o.activations != Tier::kHost && o.activations != Tier::kNvme) {
    return invalid_argument("saved activations go to the host or to NVMe");
  }
  STRATA_RETURN_IF_ERROR(check_placement(session_setup(o), session_placement(o)));
  if ((o.states == Tier::kNvme || o.activations == Tier::kNvme) && o.nvme_paths.empty()) {
    return invalid_argument(std::string(o.states == Tier::kNvme ? "optimizer states" : "saved activations") +
                            " on NVMe need nvme_paths");
  }
  if (o.gradient_buffers < 1 || o.gradient_buffers > 64) {
    return invalid_argument("gradient_buffers must be 1..64, got " + std::to_string(o.gradient_buffers));
  }
  if (!(o.clip_norm >= 0) || !std::isfinite(o.clip_norm)) {
    return invalid_argument("clip_norm must be finite and >= 0 (0 = off), got " + std::to_string(o.clip_norm));
  }
  if (o.staging_buffers < 3 || o.staging_buffers > 64) {
    return invalid_argument("staging_buffers must be 3..64, got " + std::to_string(o.staging_buffers));
  }
  if (o.numa_node < -1 || o.numa_node > 4095) {
    return invalid_argument("numa_node must be -1..4095, got " + std::to_string(o.numa_node));
  }
  if (o.compute_threads < 0 || o.compute_threads > 4096) {
    return invalid_argument("compute_threads must be 0..4096, got " + std::to_string(o.compute_threads));
  }
  STRATA_RETURN_IF_ERROR(check_state_piece_elems(o.state_piece_elems).with_context("state_piece_elems"));
  if (!gpu::backend_built(o.backend)) {
    return unimplemented(
        "this build has no CUDA (the cuda backend needs nvcc at build time); run on the "
        "host backend (device \"host\")");
  }
  return ok_status();
}

namespace {

// The host backend's staging memory: page-aligned, locked when asked, and
// a refusal says how to turn locking off.
class LockedHostMemory final : public io::BufferAllocator {
 public:
  explicit LockedHostMemory(bool lock) : inner_(lock), lock_(lock) {}
  Result<io::Buffer> allocate(uint64_t capacity_bytes, uint64_t alignment) override {
    Result<io::Buffer> b = inner_.allocate(capacity_bytes, alignment);
    if (!b && lock_) {
      return std::move(b).error().with_context(
          "locking the session's host staging memory (pin_memory: false in the config, SessionOptions::pin_memory "
          "or strata train --no-pin-memory turns locking off)");
    }
    return b;
  }

 private:
  io::AlignedAllocator inner_;
  bool lock_;
};

}  // namespace

cpu_optim::ExecutorOptions executor_options(gpu::Backend backend, int compute_threads, int numa_node) {
  cpu_optim::ExecutorOptions eo;
  // On the host backend with its compute capped, the optimizer takes the
  // other cores, as beside a GPU.
  if (backend == gpu::Backend::kHost && compute_threads > 0) {
    eo.threads = std::max(1, cpu_optim::hardware_threads() - compute_threads);
  }
  eo.numa_node = numa_node;
  if (eo.numa_node < 0 && backend == gpu::Backend::kCuda) {
    if (Result<std::vector<gpu::CudaDeviceInfo>> gpus = gpu::cuda_devices(); gpus && !gpus->empty()) {
      eo.numa_node = gpu::numa_node_of_pci(gpus->front().pci_bus_id);
    }
  }
  return eo;
}

Result<std::unique_ptr<Session>> Session::create(SessionOptions o) {
  STRATA_RETURN_IF_ERROR(check_session_options(o).with_context("session"));
  std::unique_ptr<Session> s(new Session());
  STRATA_ASSIGN_OR_RETURN(s->executor_,
                          cpu_optim::Executor::create(executor_options(o.backend, o.compute_threads, o.numa_node)));
  if (o.backend == gpu::Backend::kCuda && o.pin_memory) {
    s->allocator_ = std::make_unique<DevicePinnedMemory>(gpu::Backend::kCuda);
  } else {
    s->allocator_ = std::make_unique<LockedHostMemory>(o.pin_memory && o.backend == gpu::Backend::kHost);
  }
  gpu::DeviceSpec spec;
  spec.backend = o.backend;
  spec.capacity_bytes = o.device_bytes;
  spec.compute_threads = o.compute_threads;
  if (Trace* trace = o.trace; trace != nullptr && trace->enabled()) {
    spec.copy_observer = [trace](bool to_device, uint64_t bytes, Trace::Clock::time_point start,
                                 Trace::Clock::time_point end) {
      trace->span("copy stream", to_device ? "host->device" : "device->host", trace->us(start), trace->us(end), "copy",
                  bytes);
    };
  }
  STRATA_ASSIGN_OR_RETURN(s->device_, gpu::make_device(spec));
  STRATA_ASSIGN_OR_RETURN(s->copy_, s->device_->create_stream("session copies"));
  STRATA_ASSIGN_OR_RETURN(s->grad_copy_, s->device_->create_stream("session gradient copies"));
  s->meter_.set_trace(o.trace);
  if (o.precision == DType::kF16) {
    STRATA_ASSIGN_OR_RETURN(s->scaler_, LossScaler::create(o.loss_scale));
  }
  s->lr_ = o.adam.lr;
  s->options_ = std::move(o);
  return s;
}

Session::~Session() {
  if (stage_) stage_->cancel();  // its thread reports to the store
  accumulator_.reset();          // so does this one
  drop_prefetches();
  while (!saves_.empty()) drain_save(saves_.begin()->first).ignore();
  while (!writes_.empty()) drain_write(writes_.begin()->first);
  activations_.clear();
  for (gpu::HostPin& pin : prefetch_staging_pin_) pin = gpu::HostPin();
  for (gpu::HostPin& pin : write_staging_pin_) pin = gpu::HostPin();
  pins_.clear();
  store_.reset();  // its device memory goes back before the device
  device_.reset();
  stage_.reset();  // before the staging arena and the swap store it uses
  staging_.reset();
  swap_.reset();
}

Status Session::usable(const char* call) const {
  if (aborted_.load()) return cancelled(std::string("session: ") + call + ": the session was aborted");
  return ok_status();
}

Status Session::registered(const char* call, size_t chunk) const {
  STRATA_RETURN_IF_ERROR(usable(call));
  if (chunk >= specs_.size()) {
    return invalid_argument(std::string("session: ") + call + ": no chunk " + std::to_string(chunk) + " (" +
                            std::to_string(specs_.size()) + " registered)");
  }
  return ok_status();
}

Status Session::check_chunk(const char* call, size_t chunk) const {
  STRATA_RETURN_IF_ERROR(usable(call));
  if (!in_step_) {
    return failed_precondition(std::string("session: ") + call + " outside a step (begin_step first)" +
                               (eval_open_ ? "; outside one, acquire and release read the weights only" : ""));
  }
  return registered(call, chunk);
}

// One store for every NVMe byte, and the optimizer's staging arena.
Status Session::open_nvme() {
  const SessionOptions& o = options_;
  if (o.states != Tier::kNvme && o.activations != Tier::kNvme) return ok_status();
  STRATA_ASSIGN_OR_RETURN(swap_, io::SwapStore::open(swap_store_options(o)));
  if (o.states != Tier::kNvme) return ok_status();
  std::vector<int64_t> elems;
  for (const Spec& s : specs_) elems.push_back(s.elems);
  const uint64_t bytes = OptimizerStage::staging_bytes(*swap_, max_state_piece(elems, o.state_piece_elems),
                                                       o.adam_states, o.weights == Tier::kNvme, gradient_bytes());
  STRATA_ASSIGN_OR_RETURN(staging_, PinnedArena::create("optimizer staging", bytes,
                                                        static_cast<uint32_t>(o.staging_buffers), *allocator_,
                                                        executor_.get()));
  return ok_status();
}

Status Session::start(bool initial) {
  STRATA_RETURN_IF_ERROR(usable("start"));
  if (started()) return ok_status();
  if (specs_.empty()) return failed_precondition("session: start with no chunk registered (add_chunk first)");
  if (options_.resident_first && specs_.size() < 2) {
    return failed_precondition(
        "session: resident_first keeps the first chunk on the device and streams the rest: "
        "register at least two chunks");
  }
  const SessionOptions& o = options_;
  if (mixed_dtypes()) {
    // The placement rules (check_placement) with the chunks' own types.
    TrainSetup setup = session_setup(o);
    setup.chunk_dtypes = chunk_dtypes();
    if (Status placeable = check_placement(setup, session_placement(o)); !placeable.ok()) {
      const auto other =
          std::find_if(specs_.begin(), specs_.end(), [&](const Spec& s) { return s.dtype != o.precision; });
      return failed_precondition("session: chunk \"" + other->name + "\" computes in " +
                                 std::string(dtype_name(other->dtype)) + ", not the session's " +
                                 std::string(dtype_name(o.precision)) + ": " + std::string(placeable.message()));
    }
  }
  // The host memory the placement takes, held to its budget before any of it is allocated.
  // (A lower bound: the buffers' padding to the swap store's alignment is
  // counted exactly once they are made.)
  const uint64_t need = host_bytes_needed();
  auto over_budget = [&](const char* when, uint64_t bytes) {
    return resource_exhausted(std::string("session: ") + when + ": its host memory, " + format_bytes(bytes) +
                              " (weights, gradients, states, staging), exceeds the host budget of " +
                              format_bytes(o.host_budget_bytes) +
                              " (budgets.host); raise it, or put the states and weights on NVMe");
  };
  if (o.host_budget_bytes > 0 && need > o.host_budget_bytes) return over_budget("refused before allocating", need);
  // Everything start() allocates takes its pages from the optimizer's node.
  STRATA_ASSIGN_OR_RETURN(cpu_optim::Executor::NodeMemoryScope on_node, executor_->node_memory_scope());
  std::vector<int64_t> elems;
  for (const Spec& s : specs_) elems.push_back(s.elems);
  Status built = build(elems, initial);
  if (built.ok() && o.host_budget_bytes > 0 && host_bytes() > o.host_budget_bytes) {
    built = over_budget("refused", host_bytes());  // counted exactly, padding included
  }
  if (!built.ok()) {
    unplace();  // nothing of a failed start stays: a later start() begins afresh
    return built;
  }
  const size_t n = specs_.size();
  stale_.assign(n, false);  // the per-step records (uses_, ...) are set by begin_step
  // Placed: what each init holds (a C caller's copied values) is used up. A
  // failed start keeps them for the next.
  for (Spec& spec : specs_) spec.init = nullptr;
  // Until a step has shown the order, guess backward's: the last registered first.
  if (landing_order_.empty()) {
    for (size_t c = n; c-- > 0;) landing_order_.push_back(c);
  }
  return ok_status();
}

void Session::unplace() {
  if (stage_) stage_->set_store(nullptr);
  store_.reset();
  pins_.clear();
  for (auto* set : {&weights_, &weights_next_, &grads_, &grads_alt_}) set->clear();
  sums_.clear();
  sums_alt_.clear();
  ring_.clear();
  sum_ring_.clear();
  stage_.reset();  // before the staging arena and the swap store it uses
  staging_.reset();
  swap_.reset();
}

// start()'s allocations, in order: NVMe, the optimizer stage, the chunk
// store's device slots, each chunk's host buffers and initial state.
Status Session::build(const std::vector<int64_t>& elems, bool initial) {
  const SessionOptions& o = options_;
  STRATA_RETURN_IF_ERROR(open_nvme());
  STRATA_ASSIGN_OR_RETURN(stage_, OptimizerStage::create(elems, o.states, swap_.get(), staging_.get(), *executor_,
                                                         o.trace, o.adam_states,
                                                         o.states == Tier::kNvme ? o.state_piece_elems : 0));
  if (o.weights == Tier::kNvme) STRATA_RETURN_IF_ERROR(stage_->home_weights_on_nvme(o.precision));
  if (gradient_ring()) {
    STRATA_RETURN_IF_ERROR(stage_->home_gradients_on_nvme(o.grad_accum > 1 ? DType::kF32 : o.precision));
    STRATA_RETURN_IF_ERROR(make_rings(*std::max_element(elems.begin(), elems.end())));
  }
  if (o.speculate_in_ram && o.states == Tier::kHost) STRATA_RETURN_IF_ERROR(stage_->enable_ram_speculation());
  ChunkStoreOptions so;
  so.prefetch_depth = o.prefetch_depth;
  so.dtype = o.precision;
  if (mixed_dtypes()) so.chunk_dtypes = chunk_dtypes();
  so.states = o.states;
  so.host_memory = allocator_.get();
  so.resident_first = o.resident_first;
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<ChunkStore> store,
                          ChunkStore::create(elems, *device_, copy_, &meter_, so));
  store->set_gradient_stream(grad_copy_);
  if (o.weights == Tier::kNvme) {
    OptimizerStage* stage = stage_.get();
    STRATA_RETURN_IF_ERROR(store->set_nvme_weights({swap_.get(), [stage](size_t c) { return stage->weights_blobs(c); }}));
  }
  stage_->set_store(store.get());
  Status placed = place_chunks(initial);
  if (!placed.ok()) {
    stage_->set_store(nullptr);
    return placed;
  }
  store_ = std::move(store);
  return ok_status();
}

HostCountInput host_count_input(const SessionOptions& o, std::vector<int64_t> chunk_elems,
                                const std::vector<DType>& chunk_dtypes) {
  HostCountInput in;
  in.chunk_elems = std::move(chunk_elems);
  in.element_bytes = dtype_bytes(o.precision);
  for (DType t : chunk_dtypes) in.chunk_element_bytes.push_back(dtype_bytes(t));
  in.grad_accum = o.grad_accum;
  in.delayed_update = o.delayed_update;
  in.weights = o.weights;
  in.states = o.states;
  in.speculate_in_ram = o.speculate_in_ram && o.states == Tier::kHost;
  in.gradients_on_nvme = o.gradients == Tier::kNvme;
  in.gradient_buffers = o.gradient_buffers;
  in.staging_buffers = o.staging_buffers;
  in.prefetch_depth = o.prefetch_depth;
  in.state_piece_elems = o.state_piece_elems;
  in.state_bytes = [t = o.adam_states](int64_t n) { return OptimizerStage::state_bytes(n, t); };
  return in;
}

uint64_t Session::host_bytes_needed() const {
  std::vector<int64_t> elems;
  for (const Spec& s : specs_) elems.push_back(s.elems);
  // Unpadded: a lower bound (each buffer's alignment is in the exact count after start).
  return count_host_bytes(host_count_input(options_, std::move(elems), chunk_dtypes())).total();
}

// Each chunk's initial master weights (and states), its working weights
// on the host, its gradient buffer; what the device copies from and to, pinned.
Status Session::place_chunks(bool initial) {
  const SessionOptions& o = options_;
  int64_t largest = 0;
  for (const Spec& s : specs_) largest = std::max(largest, s.elems);
  // Chunk c's host buffers: its working weights from `master` (null: zeros,
  // for a load), zero gradients.
  auto host_buffers = [&](size_t c, const float* master) -> Status {
    const auto n = static_cast<size_t>(specs_[c].elems);
    const DType t = specs_[c].dtype;
    const size_t bytes = n * dtype_bytes(t);
    if (o.weights == Tier::kHost) {
      weights_.emplace_back(bytes);
      if (master != nullptr) {
        STRATA_RETURN_IF_ERROR(
            cpu_optim::convert(master, DType::kF32, weights_.back().data(), t, specs_[c].elems, *executor_));
      } else {
        executor_->zero(weights_.back().data(), bytes);
      }
      if (o.delayed_update) weights_next_.emplace_back(bytes);  // written whole by each update
    }
    if (!gradient_ring()) {
      grads_.emplace_back(bytes);
      executor_->zero(grads_.back().data(), bytes);
      if (o.grad_accum > 1) sums_.emplace_back(n);
      if (o.delayed_update && o.grad_accum > 1) {
        sums_alt_.emplace_back(n);  // the update reads the sums; the gradients are added in by then
      } else if (o.delayed_update) {
        grads_alt_.emplace_back(bytes);
        executor_->zero(grads_alt_.back().data(), bytes);
      }
    }
    return ok_status();
  };
  if (initial) {
    AlignedVector<float> master(static_cast<size_t>(largest));
    auto make_chunk = [&](size_t c) -> Result<const float*> {
      if (c > 0) report("initialising", static_cast<int64_t>(c), static_cast<int64_t>(specs_.size()));
      std::span<float> dst(master.data(), static_cast<size_t>(specs_[c].elems));
      if (specs_[c].init) {
        STRATA_RETURN_IF_ERROR(
            specs_[c].init(dst).with_context("session: the initial values of chunk \"" + specs_[c].name + "\""));
      } else {
        std::fill(dst.begin(), dst.end(), 0.0f);
      }
      STRATA_RETURN_IF_ERROR(host_buffers(c, master.data()));
      return static_cast<const float*>(master.data());
    };
    STRATA_RETURN_IF_ERROR(stage_->initialize_all(make_chunk));
    report("initialising", static_cast<int64_t>(specs_.size()), static_cast<int64_t>(specs_.size()));
  } else {
    stage_->leave_unset();  // on NVMe: no blob written; the load writes each
    for (size_t c = 0; c < specs_.size(); ++c) STRATA_RETURN_IF_ERROR(host_buffers(c, nullptr));
  }
  for (auto* set : {&weights_, &grads_, &weights_next_, &grads_alt_}) {
    for (AlignedVector<std::byte>& v : *set) {
      STRATA_ASSIGN_OR_RETURN(gpu::HostPin pin, gpu::HostPin::make(*device_, v.data(), v.size()));
      pins_.push_back(std::move(pin));
    }
  }
  return ok_status();
}

Status Session::set_lr(double lr) {
  STRATA_RETURN_IF_ERROR(usable("set_lr"));
  if (!(lr >= 0) || !std::isfinite(lr)) return invalid_argument("session: set_lr: the rate must be finite and >= 0");
  lr_ = lr;
  return ok_status();
}

OverlapStep Session::make_step(float grad_scale) {
  OverlapStep ov;
  cpu_optim::AdamConfig adam = options_.adam;
  ov.t = updates_ + 1;  // a skipped step is no update: Adam's t and the schedule stay
  adam.lr = made_lr_ = lr_at(options_.lr_schedule, lr_, ov.t);
  ov.config = adam;
  for (size_t c = 0; c < specs_.size(); ++c) {
    // Accumulating: the stage reads the fp32 sum, which it completes itself.
    ov.grads.push_back(options_.grad_accum == 1 ? ChunkGrad{grad_host(c), specs_[c].dtype}
                                                : ChunkGrad{sum_host(c), DType::kF32});
    // Null: the stage writes them to NVMe. Delayed: beside the ones the next step computes with.
    void* out = weights_.empty() ? nullptr : (weights_next_.empty() ? weights_ : weights_next_)[c].data();
    ov.out.push_back(out);
  }
  ov.out_dtype = options_.precision;
  if (mixed_dtypes()) ov.out_dtypes = chunk_dtypes();
  ov.order = landing_order_;
  ov.grad_scale = grad_scale / static_cast<float>(loss_scale());
  ov.clip_norm = options_.clip_norm;
  // Guess that this step neither clips nor skips when the last one did neither.
  ov.speculate = options_.speculate && !last_clipped_ && !last_skipped_;
  return ov;
}

Status Session::begin_step(float grad_scale) {
  STRATA_RETURN_IF_ERROR(usable("begin_step"));
  if (in_step_) return failed_precondition("session: begin_step: a step is open (end_step or cancel_step first)");
  STRATA_RETURN_IF_ERROR(close_eval("begin_step"));
  stream_ordered_step_ = false;
  if (!(grad_scale > 0) || !std::isfinite(grad_scale)) {
    return invalid_argument("session: begin_step: grad_scale must be finite and > 0, got " +
                            std::to_string(grad_scale));
  }
  STRATA_RETURN_IF_ERROR(start());
  if (!broken_.empty()) return failed_precondition("session: " + broken_ + "; load a checkpoint to continue");
  STRATA_RETURN_IF_ERROR(restore_stale());  // what a failed step could not put back then
  // The delayed update: one that failed runs again beside this step, from its own gradients.
  restart_failed_update();
  if (Status begun = store_->begin_step(host_weights()); !begun.ok()) {
    store_->drain();  // its reads ahead land (a failed one is this error)
    return begun;
  }
  position_.assign(specs_.size(), 0);
  for (size_t k = 0; k < landing_order_.size(); ++k) position_[landing_order_[k]] = k;
  // The exact schedule's update starts now: it reads states ahead and takes
  // each chunk as its gradient comes. The delayed one starts at end_step.
  Status begun = options_.delayed_update ? ok_status() : stage_->begin(make_step(grad_scale));
  if (!begun.ok()) {
    store_->drain();
    return begun;
  }
  uses_.assign(specs_.size(), std::nullopt);
  holds_.assign(specs_.size(), 0);
  acquired_on_.assign(specs_.size(), gpu::Stream{});
  grad_held_.assign(specs_.size(), nullptr);
  submits_.assign(specs_.size(), 0);
  landed_now_.clear();
  grad_scale_ = grad_scale;
  in_step_ = true;
  return ok_status();
}

Result<const void*> Session::acquire(size_t chunk) {
  return acquire(chunk, gpu::Stream{});
}

Result<const void*> Session::acquire(size_t chunk, gpu::Stream stream) {
  if (!in_step_ && !eval_open_) {
    STRATA_RETURN_IF_ERROR(registered("acquire", chunk));
    STRATA_RETURN_IF_ERROR(open_eval());
  }
  STRATA_RETURN_IF_ERROR(check_read("acquire", chunk));
  const std::string& name = specs_[chunk].name;
  if (in_step_ && all_in(chunk)) {
    return failed_precondition("session: acquire \"" + name +
                               "\": its gradient was submitted this step, so its weights are being updated");
  }
  if (uses_[chunk]) return acquire_held(chunk, stream);
  if (resident(chunk)) {
    STRATA_ASSIGN_OR_RETURN(const void* data, store_->resident_weights());
    uses_[chunk] = ChunkStore::Use{0, data};  // no slot: nothing to give back to the store
    holds_[chunk] = 1;
    return data;
  }
  const size_t first_slotted = options_.resident_first ? 1 : 0;
  const auto held = static_cast<int>(std::count_if(uses_.begin() + static_cast<std::ptrdiff_t>(first_slotted),
                                                   uses_.end(), [](const auto& u) { return u.has_value(); }));
  if (held > options_.prefetch_depth) {
    return resource_exhausted("session: acquire \"" + name + "\": all " + std::to_string(held) +
                              " weight slots are held (prefetch_depth + 1); release a chunk first");
  }
  if (stream.id < 0) {
    STRATA_ASSIGN_OR_RETURN(ChunkStore::Use use, store_->acquire(chunk));
    uses_[chunk] = use;
    holds_[chunk] = 1;
    return use.data;
  }
  gpu::Event ready;
  STRATA_ASSIGN_OR_RETURN(ChunkStore::Use use, store_->acquire_async(chunk, &ready));
  uses_[chunk] = use;
  holds_[chunk] = 1;
  acquired_on_[chunk] = stream;
  stream_ordered_step_ = true;
  if (ready.id >= 0) {
    Status waited = stream_wait_metered(stream, ready);  // the model's compute follows the copy
    if (!waited.ok()) {
      store_->release(use);
      uses_[chunk].reset();
      return waited;
    }
  }
  return use.data;
}

// The stream waits for `ready`; when the copy is still under way, the
// stall is timed on the stream itself (a task before the wait, one after:
// on CUDA host functions, which call no CUDA) and counted in
// device_wait_s, since the host thread no longer waits for it.
Status Session::stream_wait_metered(gpu::Stream stream, gpu::Event ready) {
  if (device_->done(ready)) return device_->stream_wait(stream, ready);
  auto t0 = std::make_shared<double>(0);
  STRATA_RETURN_IF_ERROR(device_->enqueue(stream, [t0] {
    *t0 = WaitMeter::now_s();
    return ok_status();
  }));
  STRATA_RETURN_IF_ERROR(device_->stream_wait(stream, ready));
  return device_->enqueue(stream, [t0, stalls = stream_stall_ns_] {
    stalls->fetch_add(static_cast<int64_t>((WaitMeter::now_s() - *t0) * 1e9));
    return ok_status();
  });
}

Status Session::release(size_t chunk) {
  return release(chunk, gpu::Stream{});
}

Status Session::release(size_t chunk, gpu::Stream stream) {
  STRATA_RETURN_IF_ERROR(check_read("release", chunk));
  if (!uses_[chunk]) {
    return failed_precondition("session: release \"" + specs_[chunk].name + "\": it is not acquired");
  }
  if (holds_[chunk] > 1) {  // acquired again: the last release gives the weights back
    if (stream.id >= 0 && acquired_on_[chunk].id >= 0 && stream.id != acquired_on_[chunk].id) {
      return invalid_argument("session: release \"" + specs_[chunk].name +
                              "\": acquired on another stream; release it on that one");
    }
    --holds_[chunk];
    return ok_status();
  }
  holds_[chunk] = 0;
  if (stream.id < 0) stream = acquired_on_[chunk];  // acquired on a stream: released after it
  acquired_on_[chunk] = gpu::Stream{};
  if (!resident(chunk)) {
    if (stream.id < 0) {
      store_->release(*uses_[chunk]);
    } else {
      // The slot is refilled only after what the stream has queued so far.
      STRATA_ASSIGN_OR_RETURN(gpu::Event done, device_->record(stream));
      STRATA_RETURN_IF_ERROR(store_->release_after(*uses_[chunk], done));
    }
  }
  uses_[chunk].reset();
  return ok_status();
}

Result<StepVerdict> Session::end_step() {
  STRATA_RETURN_IF_ERROR(usable("end_step"));
  if (!in_step_) return failed_precondition("session: end_step outside a step (begin_step first)");
  std::string missing, held;
  for (size_t c = 0; c < specs_.size(); ++c) {
    if (!all_in(c)) {
      missing += (missing.empty() ? "\"" : ", \"") + specs_[c].name + "\"";
      if (options_.grad_accum > 1) {
        missing +=
            " (" + std::to_string(submits_[c]) + " of " + std::to_string(options_.grad_accum) + " micro-batches)";
      }
    }
    if (uses_[c]) held += (held.empty() ? "\"" : ", \"") + specs_[c].name + "\"";
  }
  if (!missing.empty()) {
    return failed_precondition("session: end_step: no gradient submitted for " + missing + "; the step stays open");
  }
  if (!held.empty()) return failed_precondition("session: end_step: still acquired: " + held + "; release them first");
  if (options_.delayed_update) return end_delayed_step();
  Result<OverlapOutcome> outcome = stage_->finish();
  store_->end_step();
  in_step_ = false;
  if (!outcome) {
    store_->drain();                    // what it read ahead for the step lands before the next
    restore_written_weights().ignore();  // what cannot be put back now stays marked for the next step
    return std::move(outcome).error();
  }
  // A skipped step's chunks that a speculative update wrote in place get their old weights back.
  if (outcome->skipped) STRATA_RETURN_IF_ERROR(restore_written_weights());
  landing_order_ = landed_now_;
  StepVerdict v = take(*outcome, made_lr_);
  v.step = ++steps_;
  return v;
}

Status Session::cancel_step() {
  if (!in_step_) return ok_status();
  if (options_.delayed_update) {
    // Its update has not begun (the one in flight is the last step's, and goes on).
    if (accumulator_) accumulator_->drain().ignore();
    store_->drain();
    drop_prefetches();
    in_step_ = false;
    return ok_status();
  }
  // Every gradient in, the update is under way: in RAM it writes the states
  // in place, with nothing to go back to.
  bool every = true;
  for (size_t c = 0; c < specs_.size(); ++c) every = every && all_in(c);
  if (every) {
    return failed_precondition(
        "session: cancel_step: every gradient was submitted and the update is under way; "
        "end_step takes it");
  }
  if (accumulator_) accumulator_->drain().ignore();  // the sums are dropped with the step
  stage_->cancel();
  store_->drain();
  drop_prefetches();
  in_step_ = false;
  return restore_written_weights();
}

Status Session::restore_written_weights() { return restore_stale(/*mark_written=*/true); }

Status Session::restore_stale(bool mark_written) {
  if (weights_.empty()) return ok_status();  // on NVMe: the old generation was never switched from
  std::vector<void*> weights;
  for (AlignedVector<std::byte>& w : weights_) weights.push_back(w.data());
  return stage_->restore_stale_weights(&stale_, weights, chunk_dtypes(), mark_written).with_context("session");
}

Result<gpu::DeviceMemory> Session::allocate_device(uint64_t bytes, std::string_view what) {
  STRATA_RETURN_IF_ERROR(usable("allocate_device"));
  if (bytes == 0) return invalid_argument("session: allocate_device of 0 bytes (" + std::string(what) + ")");
  return device_->allocate(bytes, what);
}

Status Session::read_master(size_t chunk, std::span<float> dst) {
  STRATA_RETURN_IF_ERROR(usable("read_master"));
  if (!started()) return failed_precondition("session: read_master before start");
  if (in_step_) return failed_precondition("session: read_master during a step");
  STRATA_RETURN_IF_ERROR(close_eval("read_master"));
  STRATA_RETURN_IF_ERROR(drain_update().with_context("session: read_master"));  // a delayed update in flight
  if (chunk >= specs_.size()) return invalid_argument("session: read_master: no chunk " + std::to_string(chunk));
  if (dst.size() != static_cast<size_t>(specs_[chunk].elems)) {
    return invalid_argument("session: read_master \"" + specs_[chunk].name + "\": " +
                            std::to_string(specs_[chunk].elems) + " elements, the buffer holds " +
                            std::to_string(dst.size()));
  }
  return stage_->read_master(chunk, dst.data());
}

SessionCounters Session::counters() const {
  SessionCounters k;
  k.h2d_bytes = activation_h2d_bytes_;
  k.d2h_bytes = activation_d2h_bytes_;
  if (store_) {
    k.h2d_bytes += store_->bytes_to_device();
    k.d2h_bytes += store_->bytes_to_host();
  }
  if (swap_) {
    for (const io::DirectoryStats& d : swap_->stats().directories) {
      k.nvme_read_bytes += d.bytes_read;
      k.nvme_written_bytes += d.bytes_written;
    }
  }
  k.device_peak_bytes = device_->peak_bytes();
  k.device_wait_s = meter_.seconds() + static_cast<double>(stream_stall_ns_->load()) * 1e-9;
  return k;
}

uint64_t Session::host_bytes() const {
  uint64_t b = 0;
  for (const auto* set : {&weights_, &grads_, &weights_next_, &grads_alt_}) {
    for (const auto& v : *set) b += v.capacity();
  }
  for (const auto* set : {&sums_, &sums_alt_}) {
    for (const auto& v : *set) b += v.capacity() * 4;
  }
  for (const auto* ring : {&ring_, &sum_ring_}) {
    for (const io::Buffer& buffer : *ring) b += buffer.capacity_bytes();
  }
  if (stage_) b += stage_->host_bytes();
  if (staging_) b += staging_->total_bytes();
  if (store_) b += store_->host_bytes();
  for (const auto& [key, a] : activations_) b += a.host.size();
  for (const io::Buffer& staging : prefetch_staging_) b += staging.capacity_bytes();
  for (const io::Buffer& staging : write_staging_) b += staging.capacity_bytes();
  return b;
}

Status Session::async_error() {
  if (aborted_.load()) return cancelled("session: the session was aborted");
  if (update_failed_.load()) {
    return unavailable("session: the last delayed update failed; the next begin_step or finalize begins it again");
  }
  if (in_step_ || pending_.load()) return stage_->async_error().with_context("session: the optimizer stage");
  return ok_status();
}

Status Session::finalize() {
  STRATA_RETURN_IF_ERROR(usable("finalize"));
  if (in_step_) return failed_precondition("session: finalize during a step (end_step or cancel_step first)");
  STRATA_RETURN_IF_ERROR(close_eval("finalize"));
  // Activations saved: their copies and writes in flight land, and the
  // first failure not yet reported is (once).
  while (!saves_.empty()) STRATA_RETURN_IF_ERROR(drain_save(saves_.begin()->first).with_context("session: finalize"));
  while (!writes_.empty()) drain_write(writes_.begin()->first);
  for (auto& [key, failed] : failed_writes_) {
    if (failed.reported) continue;
    for (auto& [k, f] : failed_writes_) f.reported = true;
    return failed.status.with_context("session: finalize");
  }
  STRATA_RETURN_IF_ERROR(drain_update().with_context("session: finalize: the delayed update in flight"));
  return device_->async_error().with_context("session: finalize: the device's background work");
}

}  // namespace strata::engine
