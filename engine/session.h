// Session: the model-agnostic way into the engine. A model of the caller's
// registers its chunks (a name, an element count, initial fp32 values) and
// then drives every step itself; the session owns every byte of model
// state and decides where it lives:
//   - working weights (bf16, fp16 or fp32) between uses on the host or
//     (bf16, fp16) on NVMe,
//     brought to the device into `prefetch_depth + 1` weight slots in the
//     order the first step recorded (ChunkStore: prefetch, Belady reuse);
//   - gradients computed into one of two device gradient slots and copied
//     back into a host buffer per chunk, or into a ring of a few buffers
//     with the gradients then kept on NVMe; with grad_accum micro-batches a
//     step, each chunk's gradient comes grad_accum times and the session
//     sums them in fp32, in the order they came, beside the model's
//     compute (the optimizer reads the sum);
//   - fp32 master weights and Adam states on the host or on NVMe, updated
//     by the optimizer stage as each chunk's gradient lands (OptimizerStage:
//     exact speculation with rollback on NVMe, global-norm clipping, fp16
//     inf/nan skips, the config's rate schedule), or with the opt-in
//     delayed update beside the model's next step;
//   - the saved activations the model hands it, in RAM or on NVMe.
// A step is: begin_step; for each use of a chunk acquire (its weights on
// the device once it returns) and release; per chunk once per
// micro-batch, gradient_buffer then submit_gradient; end_step, which
// returns the verdict. The same
// calls, seed and data give the same bits on every placement: where a view
// lives never changes what it is (tests hold the session to that).
//
// Misuse — an unknown chunk, a gradient submitted twice, a step ended with
// gradients missing, acquiring a chunk whose gradient was submitted (its
// weights are being updated), calls outside a step or after abort() — is an
// error that changes nothing: the step stays open where it was.
// One thread drives a session; abort() and async_error() may come from any.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/aligned_vector.h"
#include "common/serial_queue.h"
#include "cpu_optim/executor.h"
#include "cpu_optim/optimizer.h"
#include "engine/checkpoint_io.h"
#include "engine/chunk_store.h"
#include "engine/host_count.h"
#include "engine/loss_scaler.h"
#include "engine/lr_schedule.h"
#include "engine/optimizer_stage.h"
#include "engine/pinned_arena.h"
#include "engine/plan.h"
#include "gpu/device.h"
#include "gpu/device_factory.h"
#include "io/swap_store.h"

namespace strata::engine {

struct SessionOptions {
  gpu::Backend backend = gpu::Backend::kHost;
  // The device's budget: every slot the session allocates and every
  // allocate_device() of the model comes out of it. 0: the host backend
  // uncapped; a GPU's free memory.
  uint64_t device_bytes = 0;
  int compute_threads = 0;  // the host backend's compute cores (0: all)
  // The NUMA node for the optimizer's threads and the session's host
  // memory (states, buffers, staging): -1 picks the node nearest the GPU
  // on CUDA (none on a one-node machine) and none on the host backend.
  int numa_node = -1;
  // The working weights' and gradients' type: bf16, fp16 with dynamic loss
  // scaling (loss_scale), or fp32 (the master weights' copy: small models,
  // parity with an fp32 reference; in RAM between uses).
  DType precision = DType::kBF16;
  LossScaleOptions loss_scale;
  cpu_optim::AdamConfig adam;  // adam.lr: the peak rate until set_lr
  // The rate of update t (Adam's step count: a skipped fp16 step does not
  // advance it) is lr_at(lr_schedule, the peak rate, t): warmup and decay
  // as DeepSpeed's schedulers; the default is the peak throughout.
  LrSchedule lr_schedule;
  cpu_optim::StateType adam_states = cpu_optim::StateType::kF32;
  Tier states = Tier::kHost;   // master weights and Adam states: kHost or kNvme
  Tier weights = Tier::kHost;  // working weights between uses: kHost, or kNvme (needs the states there)
  int prefetch_depth = 1;      // uses fetched ahead; depth + 1 weight slots on the device
  // The first registered chunk stays on the device for each whole step (a
  // model's embeddings, used at both ends of it): copied up once at
  // begin_step, in a buffer of its own beside the slots, with a gradient
  // buffer of its own. Needs a second chunk.
  bool resident_first = false;
  // Where save_activation() puts the model's saved activations: kHost
  // (host RAM) or kNvme (needs nvme_paths).
  Tier activations = Tier::kHost;
  float clip_norm = 0;         // global-norm clipping; 0: off
  // Micro-batches per step (1..4096): each chunk's gradient is submitted
  // this many times a step; the session adds them up in fp32 (4 bytes per
  // parameter of host memory when > 1) and the optimizer takes the sum
  // times begin_step's grad_scale (1 / grad_accum for the mean).
  int64_t grad_accum = 1;
  // States on NVMe: update each chunk as its gradient lands, guessing no
  // clip and no skip, and redo from the old states when wrong (exact).
  bool speculate = true;
  // States in RAM: the same speculation, at the price of a second copy of
  // the states (12 bytes per parameter with fp32 states): each chunk is
  // updated into the copy as its gradient lands, and the copies switch at
  // the verdict. Off: in RAM the updates wait for the verdict. The same bits.
  bool speculate_in_ram = false;
  // Where the gradients wait for the optimizer: kHost, a host buffer per
  // chunk (2 bytes a parameter in bf16 / fp16; with grad_accum > 1 its fp32
  // sum too, 4 more), or kNvme — a ring of `gradient_buffers` host buffers,
  // each the largest chunk's gradient (with grad_accum > 1 a second ring of
  // fp32 sums): the optimizer stage writes each gradient to NVMe as it
  // lands and frees its buffer once its statistics and speculative update
  // are done, and an update after the verdict (clipping fired, or the step
  // after one that clipped or skipped) reads them back beside the states.
  // Host memory no longer grows with the model's gradients. Needs the
  // states on NVMe; the gradients must then come in the gradient order
  // (set_gradient_order) and a chunk's micro-batches one after another —
  // a submission out of it is refused, since its buffer would wait for
  // one not yet submitted. The same bits as kHost.
  Tier gradients = Tier::kHost;
  int gradient_buffers = kGradientBuffers;  // 1..64
  // Opt-in, NOT exact (ZeRO-Offload's delayed parameter update): the
  // update of step t runs beside the model's compute of step t+1, which
  // therefore uses the weights from before update t (one step stale).
  // Hides the optimizer and its NVMe traffic behind the model; costs a
  // second set of the host gradient buffers (and sums) and, with the
  // weights in RAM, of the weights. end_step starts the step's update and
  // returns the verdict of the one before it, which it waits for; read_master,
  // save, load and finalize land the update in flight first. Deterministic:
  // the same bits on every placement. Not with the gradients on NVMe.
  bool delayed_update = false;
  uint64_t host_budget_bytes = 0;  // 0: not held
  uint64_t nvme_budget_bytes = 0;  // 0: not held
  std::vector<std::string> nvme_paths;
  io::Backend io_backend = io::Backend::kAuto;
  uint32_t io_queue_depth = 32;
  uint64_t io_stripe_unit_bytes = 1ull << 20;
  io::DirectMode io_direct = io::DirectMode::kRequire;
  std::optional<io::FaultConfig> faults;  // tests
  int staging_buffers = kStateStagingBuffers;
  int64_t state_piece_elems = TrainSetup{}.state_piece_elems;
  bool pin_memory = true;  // lock the host staging buffers (mlock; cudaHostAlloc on a GPU)
  Trace* trace = nullptr;  // not owned
  // Optional: called on the calling thread as long work goes chunk by
  // chunk — "initialising" (start: each chunk's initial weights and states
  // placed), "saving" (each chunk's weights, then each chunk's states),
  // "verifying" (a load: each tensor checked against its checksum) and
  // "loading" (as saving) — with the units done and the total, ending with
  // done == total. For progress output: a 10B model's states take minutes.
  std::function<void(std::string_view what, int64_t done, int64_t total)> progress;
};

// The planner's view of a session's run: the working type, accumulation,
// the delayed update, the states' type and pieces, the gradient ring; the
// tiers, with the weights always off the device between uses, and each
// chunk's micro-batches in the gradient order (set_gradient_order refuses
// a submission out of it) as one pass. What check_placement holds a
// session to; a model's own view (the GPT's: training_setup) adds its
// shapes to it.
TrainSetup session_setup(const SessionOptions& options);
// Whether `dtype` may be a chunk's working type in a session of
// `precision`: bf16 or fp32, fp16 only in an fp16 session (the loss scale
// is the session's). InvalidArgument saying why not.
Status check_chunk_dtype(DType dtype, DType precision);
Placement session_placement(const SessionOptions& options);

// What a session of these options allocates in host memory for chunks of
// these sizes, as count_host_bytes (host_count.h) takes it: the session's
// own check before it allocates counts it unpadded.
// `chunk_dtypes`: each chunk's working type where a model registered
// another than the precision (empty: the precision for every chunk).
HostCountInput host_count_input(const SessionOptions& options, std::vector<int64_t> chunk_elems,
                                const std::vector<DType>& chunk_dtypes = {});

// What Session::create refuses before it allocates anything: the placement
// rules (check_placement) for the session's tiers, the optimizer and
// schedule, and every knob out of its range. InvalidArgument naming the
// option (callers add who they are: "session", "trainer"); Unimplemented
// for a backend this build lacks.
Status check_session_options(const SessionOptions& options);

// The optimizer's threads beside a device: on the host backend with its
// compute capped, the cores it leaves; bound to `numa_node`, or with -1 on
// CUDA to the node nearest the first GPU (as sysfs reports it).
cpu_optim::ExecutorOptions executor_options(gpu::Backend backend, int compute_threads, int numa_node);

// Fills a chunk's initial fp32 master weights: `dst` holds the chunk's
// elements (called once, from start(), on the calling thread).
using ChunkInit = std::function<Status(std::span<float> dst)>;

// A tensor of the model's inside a chunk: `shape` (row-major) elements of
// the working type from element `offset` on. A checkpoint's model file
// holds a chunk's tensors under their names (a GPT's "h.3.attn.c_attn.weight")
// instead of the chunk whole, so other tools can read it. Elements no
// tensor covers are not saved and a load leaves them zero: leave only
// padding the model never reads uncovered.
struct TensorView {
  std::string name;
  int64_t offset = 0;
  std::vector<int64_t> shape;
  int64_t elems() const;
};

// What end_step() decided.
struct StepVerdict {
  // The step this is the verdict of, counted from 1: the one end_step
  // ended, or with the delayed update the one before it (0: none yet).
  int64_t step = 0;
  double grad_norm = 0;      // of the scaled gradients, before clipping
  bool clipped = false;
  bool skipped = false;      // an inf/nan gradient: nothing was updated
  bool rolled_back = false;  // speculative updates were undone (and redone unless skipped)
  double lr = 0;             // the rate of this step's update
  double loss_scale = 1;     // fp16: the scale the next step's loss takes
  StageCounters update;      // what the update moved and how long it was busy
};

struct SessionCounters {
  // Copied between host and device: weights, gradients and saved
  // activations.
  uint64_t h2d_bytes = 0, d2h_bytes = 0;
  uint64_t nvme_read_bytes = 0, nvme_written_bytes = 0;
  uint64_t device_peak_bytes = 0;  // the device's high-water mark since create
  // Waiting for the session's copies and NVMe reads (weights,
  // activations) that the prefetches did not hide: the calling thread
  // inside acquire and load_activation, and a model's stream stalled for
  // weights acquired on it (timed on the stream).
  double device_wait_s = 0;
};

class Session {
 public:
  static Result<std::unique_ptr<Session>> create(SessionOptions options);
  ~Session();

  // Registers a chunk (before start()); returns its index, 0, 1, ... in
  // registration order. `init` may be empty: zeros. `dtype`: the type the
  // model computes the chunk in — its working weights and gradient — when
  // not the session's precision: fp32 (a model's norms beside bf16
  // matrices, say) or bf16; fp16 only in an fp16 session (the loss scale
  // is the session's). Chunks in another type than the precision keep
  // their weights and gradients in RAM (not with weights or gradients on
  // NVMe). InvalidArgument for an empty or duplicate name, elems < 1 or
  // such a type; FailedPrecondition after start.
  Result<size_t> add_chunk(std::string name, int64_t elems, ChunkInit init, std::optional<DType> dtype = std::nullopt);
  // A registered chunk's working type, before start() (the same rules as
  // add_chunk's dtype). InvalidArgument for an unregistered chunk or such a
  // type; FailedPrecondition after start.
  Status set_chunk_dtype(size_t chunk, DType dtype);
  // Names a tensor of the model's inside `chunk` (before start()): see
  // TensorView. InvalidArgument for a name already used (by a chunk or a
  // tensor), an empty shape or a dimension < 1, a tensor past the chunk's
  // end, or one overlapping another of the chunk's.
  Status add_tensor(size_t chunk, TensorView tensor);
  // Places every chunk: host buffers, NVMe blobs, device slots; calls each
  // chunk's init. Refuses (ResourceExhausted naming the budget) a session
  // whose host memory exceeds host_budget_bytes. The first begin_step()
  // calls it when the caller did not.
  Status start() { return start(/*initial=*/true); }
  bool started() const { return store_ != nullptr; }

  size_t chunks() const { return specs_.size(); }
  const std::string& chunk_name(size_t chunk) const { return specs_.at(chunk).name; }
  int64_t chunk_elems(size_t chunk) const { return specs_.at(chunk).elems; }
  DType precision() const { return options_.precision; }
  // The chunk's working type: precision() unless add_chunk said otherwise.
  DType chunk_dtype(size_t chunk) const { return specs_.at(chunk).dtype; }
  const SessionOptions& options() const { return options_; }

  // The (peak) learning rate of the next steps' updates: with the default
  // schedule their rate, otherwise what lr_schedule shapes.
  Status set_lr(double lr);
  // fp16: multiply the loss by this before backward (the gradients are
  // divided by it before the update); 1 for bf16.
  double loss_scale() const { return options_.precision == DType::kF16 ? scaler_.scale() : 1.0; }
  // fp16: the scale of the next steps' losses, outside a step: a power of
  // two in [loss_scale.min_scale, 2^127]; the dynamic scaler goes on from
  // it (halving on overflows, doubling after a clean window). Another
  // precision takes only 1. InvalidArgument for such a scale,
  // FailedPrecondition inside a step; nothing changes on an error.
  Status set_loss_scale(double scale);
  // fp16: the dynamic loss scaler's state (a model's own checkpoint record keeps it).
  const LossScaler& loss_scaler() const { return scaler_; }

  // The order the model submits its chunks' gradients in, every chunk once
  // (outside a step): the optimizer reads states ahead in it. Until set, the
  // reverse of registration (backward's order of a model registered from
  // its input on); each step ends by taking the order it saw. With
  // gradients on NVMe it is a contract the session holds the model to.
  // InvalidArgument for anything but a permutation of the chunks.
  Status set_gradient_order(std::vector<size_t> order);
  const std::vector<size_t>& gradient_order() const { return landing_order_; }

  // Opens a step. `grad_scale` multiplies every submitted gradient before
  // the update (1 / micro-batches, say), besides the fp16 loss scale.
  Status begin_step(float grad_scale = 1.0f);
  bool in_step() const { return in_step_; }
  // The chunk's working weights on the device (chunk_elems of chunk_dtype())
  // once it returns, until release(chunk). A chunk may be acquired again
  // in the same step (recompute) until its gradient is submitted. Acquired
  // while it is held (a weight used at two points, a module called twice):
  // the same weights, held until as many releases — on the stream it was
  // first acquired on, or none (InvalidArgument for another stream).
  // Outside a step (evaluation, torch.no_grad()): the weights as the last
  // step left them, read-only — a pass of its own that begin_step, save,
  // load, read_master and finalize end once every chunk is released; the
  // recorded order is not changed by it, and gradient calls are refused.
  Result<const void*> acquire(size_t chunk);
  Status release(size_t chunk);
  // Where to compute the chunk's gradient on the device (chunk_elems of
  // chunk_dtype(); its contents are undefined). Two slots are handed out in
  // turn: submit one before asking for the one after the next.
  Result<void*> gradient_buffer(size_t chunk);
  // The gradient in the chunk's buffer is final: copied to the host and,
  // on the step's last micro-batch, handed to the optimizer, which may
  // update the chunk at once (an earlier micro-batch's is added into the
  // chunk's fp32 sum beside the model's compute; the chunk may then be
  // acquired and computed again).
  Status submit_gradient(size_t chunk);
  // Ordered on the device instead of on the host, for a model that enqueues
  // its compute on a stream of this session's device (device().
  // create_stream): acquire returns at once with the weights' address and
  // `stream` made to wait for their copy; release gives them back after
  // what `stream` has queued so far (a later copy into their slot waits for
  // it); submit_gradient copies the gradient out after what `stream` has
  // queued so far. The host thread waits for the model's compute only where
  // a buffer it needs is still being read. A chunk acquired on a stream and
  // released without one is released after that stream. The same bits as
  // the blocking calls; misuse is refused as by them.
  Result<const void*> acquire(size_t chunk, gpu::Stream stream);
  Status release(size_t chunk, gpu::Stream stream);
  Status submit_gradient(size_t chunk, gpu::Stream stream);
  // Micro-batches of the open step whose gradient of `chunk` was submitted.
  int submitted(size_t chunk) const { return in_step_ && chunk < submits_.size() ? submits_[chunk] : 0; }
  // Ends the step once every chunk's gradient was submitted
  // (FailedPrecondition naming the missing ones otherwise, the step open):
  // waits for the optimizer and returns its verdict. On a failure of the
  // update (I/O, say) the step is over, nothing of it was applied, and the
  // weights are as before it. With the delayed update: waits for the last
  // step's update, returns its verdict and starts this step's; when the
  // last one failed, this step is over with nothing of it kept, and the
  // failed update is begun again by the next begin_step (from its own
  // gradients, which nothing overwrote: the same numbers).
  Result<StepVerdict> end_step();
  // Abandons the open step (the model's own compute failed): nothing of it
  // is applied. OK when no step is open; FailedPrecondition once every
  // chunk's gradient was submitted (the update is under way: end_step),
  // except with the delayed update, whose update starts at end_step.
  // Activation prefetches in flight land first and are forgotten (a failed
  // read of one is not a later step's error); saved activations are kept.
  Status cancel_step();

  // Saved activations of the model (layer inputs kept for backward,
  // say) off the device: save_activation copies `bytes` from `device_src`
  // out to the tier options.activations names, under `key` (the model's
  // name for it, e.g. a layer index; saving a key again replaces it), and
  // returns once the device buffer may be reused (to NVMe: the bytes off
  // the device, the write in flight from a staging buffer — two at most —
  // and its failure reported by the next load or save of the key,
  // drop_activations or finalize); load_activation copies them back into
  // `device_dst` (the same `bytes`) and returns once they are there. Host
  // RAM is held to host_budget_bytes, NVMe to its budget. After start();
  // kept until drop_activations().
  Status save_activation(uint64_t key, const void* device_src, uint64_t bytes);
  Status load_activation(uint64_t key, void* device_dst, uint64_t bytes);
  // Stream-ordered save: the copy out follows the work enqueued on
  // `stream` so far, and the call returns without waiting for it.
  // `device_src` stays the session's until activation_saved(key, s) makes
  // a stream s wait for the copy (a load, prefetch or save of the key,
  // drop_activations and finalize wait for it on the host). On NVMe the
  // write is issued once the copy has landed: by the next activation call.
  Status save_activation(uint64_t key, const void* device_src, uint64_t bytes, gpu::Stream stream);
  // `stream` waits, on the device, until the save of `key` has left its
  // device buffer (at once when it has). NotFound when `key` was not saved;
  // InvalidArgument without a stream. A stream of id < 0 (gpu::Stream{})
  // makes every stream-ordered activation call its blocking one.
  Status activation_saved(uint64_t key, gpu::Stream stream);
  // Starts load_activation(key, device_dst, bytes) without waiting: the
  // copy up (from NVMe the read, then the copy) runs on a copy stream of
  // the session's while the model computes; the load_activation of the same key
  // and buffer that follows waits only for what is left of it. Until then
  // `device_dst` is being written. Up to two from NVMe in flight (a third
  // waits for the oldest). A later save of the key, a load into another
  // buffer or drop_activations waits for it first.
  Status prefetch_activation(uint64_t key, void* device_dst, uint64_t bytes);
  // With the model's `stream`: the copy into `device_dst` waits, on the
  // device, for the work the stream has queued by the call (its reads of
  // the buffer), not for the host to see it done. A load still returns
  // once the bytes are there.
  Status prefetch_activation(uint64_t key, void* device_dst, uint64_t bytes, gpu::Stream stream);
  Status load_activation(uint64_t key, void* device_dst, uint64_t bytes, gpu::Stream stream);
  void drop_activations();

  // Memory on the device, from the same budget (the model's activations).
  Result<gpu::DeviceMemory> allocate_device(uint64_t bytes, std::string_view what);
  gpu::Device& device() { return *device_; }

  // A chunk's fp32 master weights (chunk_elems floats), outside a step.
  Status read_master(size_t chunk, std::span<float> dst);
  // The NVMe store (null when nothing is on NVMe): tests reach its fault
  // injector through it.
  io::SwapStore* swap_store() { return swap_.get(); }
  // The optimizer stage (after start): where each chunk's states live.
  const OptimizerStage& optimizer_stage() const { return *stage_; }
  // Chunks whose weights in RAM a failed or skipped step updated in place
  // and that could not be put back yet (the next step or save does it first).
  size_t chunks_to_restore() const { return static_cast<size_t>(std::count(stale_.begin(), stale_.end(), true)); }
  // The order of uses the steps recorded, which prefetching replays (empty
  // before a step recorded one).
  const std::vector<size_t>& recorded_order() const { return store_->recorded_order(); }
  // Where a chunk's view is now, and its home.
  Residency residency(size_t chunk, View view) const { return store_->residency(chunk, view); }
  Tier home(size_t chunk, View view) const { return store_->home(chunk, view); }

  // Checkpoints, outside a step: save writes <root>/step-<n> (by the
  // CheckpointDir protocol: written aside, fsynced, renamed, `latest`
  // moved) — model.safetensors with each chunk's working weights under its
  // name, optimizer.safetensors with its master weights and Adam states
  // (<name>.master, .m, .v), session.json sealed with the step counts, the
  // loss scale, the learning rate and what each file must be. Streamed from
  // their tier, NVMe included. load restores the latest under root into a
  // session with the same chunks (names and sizes), precision and state
  // type, after verifying all of it (the seal, each file, every tensor's
  // type, shape, checksum and finiteness): a refused checkpoint
  // (DataLoss or FailedPrecondition, naming the file and what differs)
  // changes nothing. Into a session not started, it starts it without the
  // initial values (no ChunkInit called, nothing initial written to NVMe:
  // a big model's states are written once, by the load). The run then
  // continues bit for bit.
  Status save(const std::string& root);
  Status load(const std::string& root);

  // A checkpoint format of the model's own (the built-in GPT's trainer.json
  // with its data position) on the session's bytes, outside a step; save
  // and load above are these with the session's own record. prepare_save:
  // a delayed update in flight lands and what a failed step left updated is
  // put back, as save does first (FailedPrecondition after a load that
  // failed part way). visit_weights streams chunk c's working weights,
  // fn(first element, bytes) a piece at a time from their tier;
  // visit_state its optimizer state (OptimizerStage::visit_state's parts).
  Status prepare_save();
  Status visit_weights(size_t chunk, const OptimizerStage::WeightsSlice& fn);
  Status visit_state(size_t chunk, const OptimizerStage::StateSlice& fn);
  // A load of such a checkpoint, once the model verified all of it:
  // begin_load places an unstarted session without initial values (or
  // lands a started one's delayed update in flight; a failed one is
  // dropped, the load replacing all it would have changed) and refuses
  // steps and saves, naming `what`, until end_load; replace_weights and
  // replace_state fill chunk c as the visits read it; end_load sets the
  // counts and the fp16 loss scale and lets steps run again.
  struct Counts {
    int64_t steps = 0, updates = 0;
    std::optional<LossScaler::State> loss_scale;  // fp16
  };
  Status begin_load(const std::string& what);
  Status replace_weights(size_t chunk, const OptimizerStage::WeightsSlice& fn);
  Status replace_state(size_t chunk, const OptimizerStage::StateSlice& fn);
  Status end_load(const Counts& counts);
  int64_t updates_done() const { return updates_; }

  int64_t steps_done() const { return steps_; }
  // What moved so far on each link.
  SessionCounters counters() const;
  // Host memory the session holds: weights, gradients, states, staging.
  uint64_t host_bytes() const;

  // From any thread: later calls return Cancelled and change nothing; the
  // open step is abandoned when the session is destroyed.
  void abort() { aborted_.store(true); }
  // Without waiting: a failure of background work not yet reported.
  Status async_error();
  // Lands the work in flight and reports its first failure.
  Status finalize();

 private:
  Session() = default;
  struct Spec {
    std::string name;
    int64_t elems = 0;
    ChunkInit init;
    DType dtype = DType::kBF16;       // the working weights' and gradient's type
    std::vector<TensorView> tensors;  // by offset; empty: the chunk is saved whole
  };
  // The model file's tensors: each chunk's views, or the chunk whole.
  struct SavedTensor {
    size_t chunk = 0;
    int64_t offset = 0, elems = 0;
  };
  std::vector<SavedTensor> saved_tensors(std::vector<TensorInfo>* infos) const;
  // Each chunk's working type; whether any differs from the precision.
  std::vector<DType> chunk_dtypes() const {
    std::vector<DType> out;
    for (const Spec& s : specs_) out.push_back(s.dtype);
    return out;
  }
  bool mixed_dtypes() const {
    return std::any_of(specs_.begin(), specs_.end(), [&](const Spec& s) { return s.dtype != options_.precision; });
  }
  nlohmann::json chunks_record() const;
  bool name_used(const std::string& name) const;
  Status usable(const char* call) const;
  bool resident(size_t chunk) const { return options_.resident_first && chunk == 0; }
  // Every micro-batch's gradient of the chunk is in: the optimizer has it.
  bool all_in(size_t chunk) const { return submits_[chunk] == options_.grad_accum; }
  // Usable and `chunk` registered; check_chunk: besides, inside a step.
  Status registered(const char* call, size_t chunk) const;
  Status check_chunk(const char* call, size_t chunk) const;
  // acquire and release: inside a step, or an evaluation pass (below).
  Status check_read(const char* call, size_t chunk) const;
  // An evaluation pass: acquire outside a step opens one (the store's pass
  // over the weights as they are, a delayed update landed first, nothing of
  // the optimizer's); the calls that need no pass close it, once nothing is
  // acquired (FailedPrecondition naming the chunk held, otherwise).
  Status open_eval();
  Status close_eval(const char* call);
  bool eval_open_ = false;
  void report(std::string_view what, int64_t done, int64_t total) const {
    if (options_.progress) options_.progress(what, done, total);
  }
  Status open_nvme();
  // What start() will hold in host memory, from the chunk sizes alone.
  uint64_t host_bytes_needed() const;
  // start(); with `initial` false (a load before start) no chunk's init is
  // called and nothing initial is written: the load fills every byte.
  Status start(bool initial);
  Status build(const std::vector<int64_t>& elems, bool initial);
  Status place_chunks(bool initial);
  // Undoes a start that failed part way or was refused: nothing stays.
  void unplace();
  OverlapStep make_step(float grad_scale);
  // The counts a finished update moves (loss scale, updates, the next
  // speculation's guess), and its verdict.
  StepVerdict take(const OverlapOutcome& outcome, double lr);
  // The delayed update: end_step's part, landing the update in flight
  // (drain_update: OK when none), and beginning a failed one again.
  Result<StepVerdict> end_delayed_step();
  Status drain_update(StepVerdict* verdict = nullptr);
  void restart_failed_update();
  void begin_update(OverlapStep step);
  std::function<Status()> adding(std::function<Status()> landed, size_t chunk, bool first);
  // Gradients on NVMe: the rings, and the checks and waits of a submission.
  bool gradient_ring() const { return options_.gradients == Tier::kNvme; }
  // Bytes of one element of a gradient on NVMe (its fp32 sum when
  // accumulating); 0 with the gradients on the host.
  uint64_t gradient_bytes() const {
    if (!gradient_ring()) return 0;
    return options_.grad_accum > 1 ? 4 : dtype_bytes(options_.precision);
  }
  Status make_rings(int64_t largest);
  Status ring_ready(size_t chunk, int micro_batch) const;
  // Where chunk c's gradient lands on the host, and where its sum is kept.
  std::byte* grad_host(size_t c) {
    return gradient_ring() ? ring_[position_[c] % ring_.size()].data() : grads_[c].data();
  }
  float* sum_host(size_t c) {
    return gradient_ring() ? reinterpret_cast<float*>(sum_ring_[position_[c] % sum_ring_.size()].data())
                           : sums_[c].data();
  }
  // Chunks the stage updated in place are put back from their master
  // weights (a failed, cancelled or skipped step); what cannot be now
  // stays stale and restore_stale() puts it back before the next step.
  Status restore_written_weights();
  Status restore_stale(bool mark_written = false);
  Status write_checkpoint(const std::string& tmp);
  Result<nlohmann::json> checked_record(const std::string& path) const;
  Status read_checkpoint(const std::string& path, const SafetensorsReader& model, const SafetensorsReader& opt);
  Status write_weights(SafetensorsWriter& model, const std::vector<SavedTensor>& saved);
  Status check_access(const char* call, size_t chunk) const;
  Status read_weights(const SafetensorsReader& model, const std::vector<SavedTensor>& saved,
                      const std::vector<TensorInfo>& infos);

  SessionOptions options_;
  std::vector<Spec> specs_;
  std::unique_ptr<cpu_optim::Executor> executor_;
  std::unique_ptr<io::BufferAllocator> allocator_;
  std::unique_ptr<io::SwapStore> swap_;
  std::unique_ptr<PinnedArena> staging_;
  std::unique_ptr<OptimizerStage> stage_;
  std::unique_ptr<gpu::Device> device_;
  gpu::Stream copy_{};
  gpu::Stream grad_copy_{};  // gradients to the host (the store's gradient stream)
  WaitMeter meter_;
  // Nanoseconds model streams stalled for weights acquired on them
  // (stream_wait_metered; added on the streams' side, hence shared).
  std::shared_ptr<std::atomic<int64_t>> stream_stall_ns_ = std::make_shared<std::atomic<int64_t>>(0);
  Status stream_wait_metered(gpu::Stream stream, gpu::Event ready);
  Result<const void*> acquire_held(size_t chunk, gpu::Stream stream);
  // Each chunk's working weights in RAM, for the store's begin_step (null
  // for every chunk when they are homed on NVMe).
  std::vector<const void*> host_weights() const {
    std::vector<const void*> host;
    for (size_t c = 0; c < specs_.size(); ++c) host.push_back(weights_.empty() ? nullptr : weights_[c].data());
    return host;
  }
  bool stream_ordered_step_ = false;  // a chunk of this step was acquired on a stream
  std::unique_ptr<ChunkStore> store_;
  // Each chunk's bytes in its working type (chunk_dtype).
  std::vector<AlignedVector<std::byte>> weights_;  // empty with the weights on NVMe
  std::vector<AlignedVector<std::byte>> grads_;
  // grad_accum > 1: each chunk's fp32 sum of the step's micro-batches, made
  // on the accumulator's thread as their gradients land (the last one's is
  // added by the optimizer stage as it takes the chunk).
  std::vector<AlignedVector<float>> sums_;
  std::unique_ptr<SerialQueue> accumulator_;
  // The delayed update: the set the update in flight reads (the gradients,
  // or their sums when accumulating; it trades places with grads_ / sums_
  // as the update starts), the
  // weights it writes beside the ones the model computes with (they trade
  // places when it lands updated), the step it is (kept to begin it again
  // when it failed), and the rate it takes.
  std::vector<AlignedVector<std::byte>> grads_alt_, weights_next_;
  std::vector<AlignedVector<float>> sums_alt_;
  OverlapStep in_flight_;
  double in_flight_lr_ = 0;
  double made_lr_ = 0;  // the rate of the update make_step made last
  int64_t in_flight_step_ = 0;
  float grad_scale_ = 1;                    // the open step's
  std::atomic<bool> pending_{false};        // an update in flight (async_error reads it from any thread)
  std::atomic<bool> update_failed_{false};  // ... that failed: begun again before anything waits for it
  // Gradients on NVMe instead (grads_ and sums_ empty): the chunk at
  // position k of the gradient order uses buffer k % gradient_buffers of
  // each ring (sum_ring_: grad_accum > 1).
  std::vector<io::Buffer> ring_, sum_ring_;
  std::vector<size_t> position_;  // per chunk: its place in landing_order_
  std::vector<gpu::HostPin> pins_;
  // Saved activations by key: host bytes (pinned), or a blob on NVMe
  // reached through one staging buffer.
  struct Activation {
    uint64_t bytes = 0;
    AlignedVector<std::byte> host;  // kHost
    gpu::HostPin pin;
  };
  std::map<uint64_t, Activation> activations_;
  // The activations' bytes copied off the device and back (counters()).
  uint64_t activation_d2h_bytes_ = 0, activation_h2d_bytes_ = 0;
  // Loads started by prefetch_activation, by key; from NVMe each reads into
  // a staging buffer of its own, and the read's outcome is kept for the load.
  // A copy of an activation between the tiers: the model's work it
  // follows when stream-ordered (none: id -1), and its own end.
  struct ActivationCopy {
    gpu::Event after_model;
    gpu::Event done;
  };
  // The host waits for a copy: for the model's work unmetered (its own
  // compute), then for the copy, metered (what the model waits for beyond
  // its compute).
  Status wait_copy(const ActivationCopy& copy);
  struct Prefetch {
    void* dst = nullptr;
    ActivationCopy copy;  // the copy up
    int staging = 0;
    std::shared_ptr<Status> read;  // kNvme
  };
  static constexpr int kPrefetchStaging = 2;
  std::map<uint64_t, Prefetch> prefetches_;
  gpu::Stream prefetch_copy_{};  // made by the first prefetch
  io::Buffer prefetch_staging_[kPrefetchStaging];
  gpu::HostPin prefetch_staging_pin_[kPrefetchStaging];
  Status stage_activation(uint64_t bytes, io::Buffer* buffer, gpu::HostPin* pin);
  Status check_activation(const char* call, uint64_t key, const void* device_dst, uint64_t bytes) const;
  Status drain_prefetch(uint64_t key, bool report_read = true);
  void drop_prefetches();
  // NVMe: saves whose write is in flight, by key, each from a staging
  // buffer of its own; a load of the key, a save over it, drop_activations
  // and finalize wait for it (and report its failure).
  // A stream-ordered save's write is issued once its copy into the
  // staging buffer (`copied`) has landed.
  struct Write {
    io::Ticket ticket;
    int staging = 0;
    bool issued = true;
    bool failed = false;  // the copy or the write's submission failed (failed_writes_ says how)
    ActivationCopy copy;  // into the staging buffer
  };
  static constexpr int kWriteStaging = 2;
  std::map<uint64_t, Write> writes_;
  io::Buffer write_staging_[kWriteStaging];
  gpu::HostPin write_staging_pin_[kWriteStaging];
  void drain_write(uint64_t key);
  void issue_write(uint64_t key, Write& w);
  void issue_copied_writes();
  // Host RAM: stream-ordered saves whose copy may be in flight, by key.
  std::map<uint64_t, ActivationCopy> saves_;
  Status drain_save(uint64_t key);
  Status host_activation(uint64_t key, uint64_t bytes);
  // Writes that failed, by key, until the key is saved again: each load of
  // the key reports it, finalize those no load reported (once);
  // drop_activations forgets them.
  struct FailedWrite {
    Status status;
    bool reported = false;
  };
  std::map<uint64_t, FailedWrite> failed_writes_;
  std::string activation_blob(uint64_t key) const { return "activation-checkpoint/" + std::to_string(key); }
  LossScaler scaler_;
  double lr_ = 0;

  // The open step: the per-chunk records below are set by begin_step and
  // read only while in_step_.
  std::atomic<bool> in_step_{false};  // read by async_error() from any thread
  std::vector<std::optional<ChunkStore::Use>> uses_;  // per chunk: the use acquired and not released
  std::vector<int> holds_;                             // per chunk: acquires of that use not yet released
  std::vector<gpu::Stream> acquired_on_;              // per chunk: the stream it was acquired on (or none)
  std::vector<void*> grad_held_;  // per chunk: its gradient buffer on the device, handed out, not submitted
  std::vector<int> submits_;      // per chunk: its gradients submitted this step
  std::vector<bool> stale_;  // per chunk: weights in RAM a failed step left updated
  // A load that failed part way (an I/O error after verifying): steps and
  // saves are refused until a load succeeds. The reason, or empty.
  std::string broken_;
  std::vector<size_t> landing_order_;  // the order the last step submitted its gradients
  std::vector<size_t> landed_now_;     // this step's, so far
  bool last_clipped_ = false, last_skipped_ = false;
  int64_t steps_ = 0, updates_ = 0;
  std::atomic<bool> aborted_{false};
};

}  // namespace strata::engine
