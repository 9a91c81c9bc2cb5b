// The optimizer stage of the step: fp32 master weights and Adam states of
// every chunk, kept in host memory or on NVMe (SwapStore), updated by the CPU
// optimizer, with the new low-precision weights written out for the device.
//
// With states on NVMe the stage is a pipeline over the chunks' pieces (a
// chunk, or a piece of one bigger than `piece_elems`): while piece j is
// updated on the optimizer threads, the next ones are being read and piece
// j-1 written, through the leased staging buffers — so the step costs
// about the slower of NVMe and CPU, not their sum. Where the bytes
// live never changes what they are: host and NVMe give the same bits
// (tested). A failed read or write ends the step with the error (naming the
// chunk); the swap store never serves a half-written chunk as valid.
//
// Per piece the state is one blob: [master fp32 | m | v], m and v in the
// stage's state type (fp32, bf16, or 8-bit blockwise codes followed by
// their per-block fp32 scales: cpu_optim's StateType), each array starting
// on a 64-byte boundary (StateLayout).
//
// The overlapped step (begin / land / finish) runs the stage on its own
// thread while the caller is still in backward: states are read ahead in the
// order gradients will land, each chunk's gradient statistics (for the
// global norm and the inf/nan check) are taken as soon as it lands, and —
// with states on NVMe and `speculate` set — each chunk is updated and
// written as soon as it lands, assuming the step neither clips nor skips.
// Updated states go to the chunk's other blob (two per chunk, so NVMe holds
// states twice); only when the whole step's verdict confirms the guess do
// the chunks switch to the new blobs. When the verdict differs (clipping
// fired, or an inf/nan), the old blobs are still intact: the step is redone
// from them with the true scale, or dropped when skipped. Exact either way:
// the same bits as the serial step (tested). Without speculation the reads
// and statistics still overlap backward and the updates follow the verdict.
#pragma once

#include <array>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "common/aligned_vector.h"
#include "cpu_optim/optimizer.h"
#include "engine/chunk_store.h"
#include "engine/pinned_arena.h"
#include "engine/plan.h"
#include "engine/trace.h"
#include "io/swap_store.h"

namespace strata::engine {

struct ChunkGrad {
  const void* data = nullptr;  // n elements of `dtype`
  DType dtype = DType::kBF16;
};

struct StageCounters {
  uint64_t nvme_bytes_read = 0;
  uint64_t nvme_bytes_written = 0;
  int64_t nonfinite = 0;  // gradient elements that were inf/nan (kReportOnly: caller rolls back)
  double seconds = 0;  // busy: I/O waits, statistics and updates (not waiting for gradients)
};

// One overlapped step; grads and out are indexed by chunk and must stay
// valid until finish() — with gradients on NVMe (home_gradients_on_nvme),
// grads[c] only from land(c) until the stage released it
// (wait_gradients_released), and each must start on the swap store's
// alignment and hold the chunk's bytes padded to it.
struct OverlapStep {
  cpu_optim::OptimizerConfig config;
  int64_t t = 0;
  std::vector<ChunkGrad> grads;
  std::vector<void*> out;
  DType out_dtype = DType::kBF16;
  std::vector<DType> out_dtypes;  // per chunk, where they differ (empty: out_dtype for every chunk)
  DType out_dtype_of(size_t chunk) const { return out_dtypes.empty() ? out_dtype : out_dtypes[chunk]; }
  std::vector<size_t> order;  // the order land() will be called in: every chunk once
  float grad_scale = 1.0f;    // applied to every gradient (1/accumulation, 1/loss scale)
  double clip_norm = 0;       // global-norm clipping of the scaled gradients; 0 = off
  // Update as chunks land, assuming no clip and no skip: on NVMe, or in RAM
  // after enable_ram_speculation().
  bool speculate = false;
};

struct OverlapOutcome {
  StageCounters counters;
  double grad_norm = 0;      // of the scaled gradients
  bool clipped = false;
  bool skipped = false;      // an inf/nan gradient: no chunk changed
  bool rolled_back = false;  // speculative updates were undone (then redone, unless skipped)
};

// Where each array of a chunk's state blob starts, in bytes.
struct StateLayout {
  uint64_t m = 0, v = 0;              // the m and v arrays
  uint64_t m_scale = 0, v_scale = 0;  // their per-block scales (8-bit states only)
  int64_t scales = 0;                 // how many scales each 8-bit array has (0 otherwise)
  uint64_t bytes = 0;                 // the whole blob
  static StateLayout of(int64_t elems, cpu_optim::StateType type);
};

class OptimizerStage {
 public:
  ~OptimizerStage();
  // `chunk_elems`: elements per chunk (model_layout order). States on
  // Tier::kHost or Tier::kNvme; for NVMe, `swap` and `staging` (>= 3 buffers
  // of state_bytes(max piece), padded to the swap alignment) are required.
  // `states`: how m and v are stored (fp32, bf16 or 8-bit blockwise).
  // `piece_elems` (states on NVMe; DeepSpeed's sub_group_size): a chunk of
  // more elements is split into pieces of at most that many, each with its
  // own blobs, staging buffer, read, update and write — the unit of the
  // NVMe pipeline, so the staging buffers hold pieces, not chunks, and a
  // big chunk's read, update and write overlap one another. 0: whole chunks.
  // The same bits either way (tested). Pieces: state_piece_sizes (plan.h).
  static Result<std::unique_ptr<OptimizerStage>> create(std::vector<int64_t> chunk_elems, Tier tier,
                                                        io::SwapStore* swap, PinnedArena* staging,
                                                        cpu_optim::Executor& executor, Trace* trace = nullptr,
                                                        cpu_optim::StateType states = cpu_optim::StateType::kF32,
                                                        int64_t piece_elems = 0);

  // Homes the working weights (dtype: bf16 or fp16) on NVMe too, one blob
  // per piece beside its state, written by every update; the caller then
  // reads them from weights_blobs(c) and passes null outputs to begin().
  // States on NVMe only; before initialize(); the staging buffers must hold
  // staging_bytes(..., weights = true, ...).
  Status home_weights_on_nvme(DType dtype);
  bool weights_on_nvme() const { return weights_nvme_; }
  // Homes the step's gradients on NVMe too (`dtype`: the device's bf16 or
  // fp16 gradients as they land, or fp32 sums of them): as each chunk lands, the
  // stage writes its gradient to a scratch blob per piece, and the caller's
  // buffer for it is free again once the stage released the chunk
  // (wait_gradients_released) — so the caller can keep a few gradient
  // buffers in a ring instead of one per chunk. An update after the verdict
  // (the first one, or one redone with the clip factor) reads each piece's
  // gradient back beside its state. States on NVMe only; before a step; the
  // staging buffers must hold staging_bytes(..., dtype_bytes(dtype)).
  Status home_gradients_on_nvme(DType dtype);
  bool gradients_on_nvme() const { return grads_nvme_; }
  // During a step with gradients on NVMe (any thread): waits until the
  // stage is done with the gradient buffers of the first `count` chunks of
  // the landing order — their NVMe copies written, their speculative
  // updates done — or the step ended short of them (its error; Cancelled
  // when it was abandoned).
  Status wait_gradients_released(size_t count);
  // States in RAM: keep a second copy of every chunk's state (12 bytes per
  // parameter) so that speculative steps can update each chunk as it lands,
  // into the copy, and switch to it at the verdict (or drop it), as on NVMe.
  // Before initialize().
  Status enable_ram_speculation();
  bool ram_speculation() const { return !next_.empty(); }
  // The blobs holding chunk c's working weights now, one per piece at its
  // byte offset in the chunk: those of the last finished step, also while
  // the next runs (its switch takes effect in finish(); the caller's thread).
  std::vector<ChunkStore::BlobPiece> weights_blobs(size_t chunk) const;
  // The NVMe pipeline's units: every chunk's pieces, in chunk order.
  size_t pieces() const { return pieces_.size(); }
  int64_t piece_elems(size_t piece) const { return pieces_[piece].elems; }
  // The blob holding a piece's state now (as weights_blobs; the caller's thread).
  const std::string& state_blob(size_t piece) const { return blob(piece, gen_[piece]); }
  // One staging buffer: a piece's state, then (weights or gradients homed
  // on NVMe) its 2-byte working weights and its gradient (`gradient_bytes`
  // per element: 2, or 4 for fp32 sums; 0 when not homed there), each
  // padded to the swap store's alignment.
  static uint64_t staging_bytes(const io::SwapStore& swap, int64_t elems, cpu_optim::StateType states, bool weights,
                                uint64_t gradient_bytes) {
    const uint64_t n = static_cast<uint64_t>(elems);
    return swap.padded_size(state_bytes(elems, states)) + (weights ? swap.padded_size(2 * n) : 0) +
           (gradient_bytes > 0 ? swap.padded_size(gradient_bytes * n) : 0);
  }
  // Chunk c's working weights out of / into their NVMe blob (checkpoints).
  // A piece at a time: `slice(offset, bytes)` gets the piece's 2-byte
  // weights from element `offset` of the chunk; visit_weights' bytes hold
  // them, replace_weights' are to be filled, then written back.
  using WeightsSlice = std::function<Status(int64_t offset, std::span<std::byte> bytes)>;
  Status visit_weights(size_t chunk, const WeightsSlice& slice);
  Status replace_weights(size_t chunk, const WeightsSlice& slice);

  // Sets chunk c's master weights (m = v = 0), and its working weights when on NVMe.
  Status initialize(size_t chunk, const float* master);
  // The same for every chunk in order: master(c) gives chunk c's master
  // weights (chunk_elems(c) floats, read before master(c + 1) is asked
  // for). On NVMe the writes stay in flight while the next chunk's weights
  // are made, as many as the staging buffers but one; every write has
  // landed when it returns, an error or not.
  using MasterSource = std::function<Result<const float*>(size_t chunk)>;
  Status initialize_all(const MasterSource& master);
  // Instead of initialize(): states in RAM get their buffers, zeroed; on
  // NVMe nothing is written. For a replace_state() of every chunk (a
  // checkpoint's load) to fill.
  void leave_unset();

  // One optimizer step t over every chunk: grads[c] in, new weights out[c]
  // (n elements of out_dtype each). `options.nonfinite` should be
  // kReportOnly: the engine decides skipping globally before the stage.
  Result<StageCounters> step(const cpu_optim::OptimizerConfig& config, int64_t t, std::span<const ChunkGrad> grads,
                             std::span<void* const> out, DType out_dtype, const cpu_optim::StepOptions& options);

  // The overlapped step. begin() starts the stage's thread; land(c) says
  // chunk c's gradient is final once `ready` (called on the stage's thread,
  // may be empty) returns OK; finish() waits for the end and reports. An
  // error (I/O, a failing `ready`) ends the step: the chunks keep their old
  // states. begin() must be followed by finish(), on every path.
  Status begin(OverlapStep step);
  void land(size_t chunk, std::function<Status()> ready = {});
  Result<OverlapOutcome> finish();
  // Without waiting: the step in flight's error if its worker has already
  // ended with one, else OK (running, done well, or no step). finish()
  // still returns it. Any thread.
  Status async_error();
  // Abandons the step in flight (the caller's backward failed): the stage's
  // thread stops at the next chunk that has not landed; no chunk changes.
  void cancel();
  bool in_step() const { return in_step_; }
  // After finish() or cancel(): the chunks whose new weights the last step
  // wrote into its `out` buffers (any piece of them).
  const std::vector<bool>& chunks_written() const { return written_; }
  // Reports every move of the states between NVMe and the staging buffers
  // to `store` (its residency record); null: none. Not during a step.
  void set_store(ChunkStore* store);

  // Copies chunk c's master weights into `dst` (n floats), for checks.
  Status read_master(size_t chunk, float* dst);
  // Chunk c's working weights made again from its master weights into
  // `dst` (n elements of `dtype`: bf16, fp16 or fp32): what a step that failed or
  // was skipped after updating them in place puts back.
  Status weights_from_master(size_t chunk, void* dst, DType dtype);
  // Working weights in RAM that a failed or skipped step updated in place:
  // with `mark_written`, the chunks the last step wrote (chunks_written)
  // are marked in `stale` first; then each marked chunk's weights[c] is
  // remade from its master weights (in dtypes[c]) and its mark cleared. The
  // first failure ends it, the chunks not yet put back still marked.
  Status restore_stale_weights(std::vector<bool>* stale, const std::vector<void*>& weights,
                               const std::vector<DType>& dtypes, bool mark_written);
  // Chunk c's whole state blob (state_bytes(n, state_type()) bytes, laid
  // out as StateLayout says) out of / into the stage, for checkpoints and
  // resume. Through the staging arena on NVMe.
  Status read_state(size_t chunk, std::byte* dst);
  Status write_state(size_t chunk, const std::byte* src);
  // The same a piece at a time, with no chunk-sized buffer (checkpoints of
  // big chunks): `slice(part, offset, bytes)` is called for each array of
  // each piece — part 0..4: master, m, v, m's scales, v's scales (8-bit
  // states) — with `offset` the bytes' place in that array of the whole
  // chunk. visit_state's bytes hold the state; replace_state's are to be
  // filled (all of them, over the calls), then written back. visit_state
  // with `parts` = kMasterOnly visits the master weights alone and, on NVMe,
  // reads only the leading stripe units of each piece's blob that hold them
  // (a third of fp32 states' bytes).
  using StateSlice = std::function<Status(int part, uint64_t offset, std::span<std::byte> bytes)>;
  static constexpr int kMasterOnly = 1;  // parts 0..kMasterOnly-1
  static constexpr int kAllParts = 5;
  Status visit_state(size_t chunk, const StateSlice& slice, int parts = kAllParts);
  Status replace_state(size_t chunk, const StateSlice& slice);
  cpu_optim::StateType state_type() const { return state_type_; }
  size_t chunks() const { return elems_.size(); }
  int64_t chunk_elems(size_t chunk) const { return elems_[chunk]; }

  Tier tier() const { return tier_; }
  // Host memory the stage's states hold (host tier; staging arenas are the caller's).
  uint64_t host_bytes() const {
    uint64_t b = 0;
    for (const auto& v : host_) b += v.capacity();
    for (const auto& v : next_) b += v.capacity();
    return b;
  }
  static uint64_t state_bytes(int64_t elems, cpu_optim::StateType states = cpu_optim::StateType::kF32) {
    return StateLayout::of(elems, states).bytes;
  }

 private:
  OptimizerStage() = default;
  // A piece of a chunk: its elements [offset, offset + elems).
  struct Piece {
    size_t chunk = 0;
    size_t index = 0;  // among its chunk's pieces
    int64_t offset = 0;
    int64_t elems = 0;
  };
  size_t pieces_of(size_t chunk) const { return first_piece_[chunk + 1] - first_piece_[chunk]; }
  // A piece's blobs (a chunk in one piece keeps the chunk's name).
  std::string piece_name(size_t piece) const;
  // Built once (names_), not per request: the state's generation 0 and 1,
  // then the weights'.
  const std::string& blob(size_t piece, int gen) const { return names_[piece][gen]; }
  const std::string& weights_blob(size_t piece, int gen) const { return names_[piece][2 + gen]; }
  const std::string& gradient_blob(size_t piece) const { return names_[piece][4]; }
  uint64_t weights_offset(size_t piece) const {
    return swap_->padded_size(state_bytes(pieces_[piece].elems, state_type_));
  }
  // Where a piece's gradient lies in its staging buffer (after its state
  // and weights), and its bytes.
  uint64_t gradient_offset(size_t piece) const {
    return staging_bytes(*swap_, pieces_[piece].elems, state_type_, weights_nvme_, /*gradient_bytes=*/0);
  }
  uint64_t gradient_bytes(size_t piece) const {
    return dtype_bytes(grads_dtype_) * static_cast<uint64_t>(pieces_[piece].elems);
  }
  Status check_nvme_home(const char* what, bool weights, uint64_t gradient_bytes) const;
  // Gradients on NVMe: the writes of chunk c's gradient pieces, from the
  // caller's buffer, issued once it landed (the stage's thread).
  Status write_gradient(size_t chunk);
  // Waits for the gradient writes of pieces [first, end) still in flight;
  // the first error, naming its chunk.
  Status wait_gradient_writes(size_t first, size_t end);
  // Waits for chunk c's, then counts the chunk released (its buffer free).
  Status release_gradient(size_t chunk);
  // A blob read into a staging buffer (at least its first `prefix_bytes`:
  // SwapStore::read_prefix), or a zeroed staging buffer filled by `fill` and
  // written as `bytes` of the blob; waited for. `what` names the data in
  // errors.
  Result<PinnedArena::Lease> read_staged(const std::string& blob, const std::string& what,
                                         uint64_t prefix_bytes = UINT64_MAX);
  using Fill = std::function<Status(std::byte*)>;
  Status write_staged(const std::string& blob, uint64_t bytes, const Fill& fill, const std::string& what);
  // A staged read or write submitted, not waited for (the lease goes with
  // the ticket: a DMA target until then); submit_staged is write_staged's
  // first half.
  struct StagedRequest {
    io::Ticket ticket;
    PinnedArena::Lease lease;
    std::string what;
  };
  Result<StagedRequest> submit_staged(const std::string& blob, uint64_t bytes, const Fill& fill, std::string what);
  // Staged requests in flight, oldest first (initialize_all's writes,
  // visit_state's reads).
  class InFlight;
  // Chunk c's initial blobs on NVMe — each piece's state (master, zero m
  // and v) and, when homed there, its working weights — handed to `write`.
  using InitialWrite =
      std::function<Status(const std::string& blob, uint64_t bytes, const Fill& fill, const std::string& what)>;
  Status initial_writes(size_t chunk, const float* master, const InitialWrite& write);
  void initialize_in_ram(size_t chunk, const float* master);
  Status run_overlap();
  Status run_overlap_body();
  Status wait_landed(size_t chunk);
  class Pipeline;
  // One piece's update (in ov_'s step), traced. `out`: where its new
  // weights go (null: ov_'s output for its chunk, at the piece's offset).
  // `state_next`: null to update in place, else where the new state goes.
  // `grad`: the piece's gradient, when not in ov_.grads (read from NVMe).
  Status traced_update(size_t piece, std::byte* state, void* out, const cpu_optim::StepOptions& options,
                       StageCounters* counters, std::byte* state_next = nullptr, const void* grad = nullptr);
  // Every piece, in ov_.order's chunk order, through the NVMe pipeline (a
  // fresh one, or one whose reads are already under way); writes go to the
  // other blobs.
  Result<StageCounters> update_pass(const cpu_optim::StepOptions& options, Pipeline* prefetched);
  cpu_optim::ParamSpan span_over(std::byte* state, int64_t n, const ChunkGrad& g, void* out, DType out_dtype) const;
  // Where each array of a piece's state lies in its blob (`at`) and in
  // that array of its chunk (`offset`).
  struct Slice {
    int part = 0;
    uint64_t offset = 0, at = 0, bytes = 0;
  };
  std::vector<Slice> slices(size_t piece) const;
  cpu_optim::StateType state_type_ = cpu_optim::StateType::kF32;
  std::vector<int64_t> elems_;
  std::vector<Piece> pieces_;       // every chunk's pieces, in chunk order
  std::vector<size_t> first_piece_;  // chunk c's pieces: [first_piece_[c], first_piece_[c + 1])
  std::vector<size_t> piece_order_;  // the step's pieces in ov_.order's chunk order
  Tier tier_ = Tier::kHost;
  io::SwapStore* swap_ = nullptr;
  PinnedArena* staging_ = nullptr;
  cpu_optim::Executor* executor_ = nullptr;
  Trace* trace_ = nullptr;
  ChunkStore* store_ = nullptr;
  void moved(size_t piece, Residency now) const {
    if (store_ != nullptr) store_->states_moved(pieces_[piece].chunk, now, pieces_[piece].index);
  }
  std::vector<AlignedVector<std::byte>> host_;  // state blobs on the host tier (one piece per chunk)
  std::vector<AlignedVector<std::byte>> next_;  // their second copies, with RAM speculation
  std::vector<int> gen_;                  // which of its two blobs holds each piece's state (NVMe)
  // Each piece's blob names: blob(), weights_blob(), gradient_blob().
  std::vector<std::array<std::string, 5>> names_;
  bool weights_nvme_ = false;
  DType weights_dtype_ = DType::kBF16;
  bool grads_nvme_ = false;
  DType grads_dtype_ = DType::kBF16;
  // Gradients on NVMe, during a step (the stage's thread): each piece's
  // gradient write in flight.
  std::vector<std::optional<io::Ticket>> grad_writes_;

  // The overlapped step in flight.
  OverlapStep ov_;
  OverlapOutcome outcome_;
  // The step's verdict, for finish() to apply (written by the worker
  // before job_done_): switch every piece to its other blob (NVMe), or the
  // states to their second copies (RAM speculation).
  bool switch_generations_ = false, switch_ram_copies_ = false;
  std::vector<cpu_optim::GradStats> stats_;
  std::vector<bool> written_;  // per chunk: traced_update wrote into ov_.out (the stage's thread, then the caller's)
  // One worker thread for the stage's life, started by the first begin():
  // each begin() hands it a step (job_), finish()/cancel() wait for job_done_.
  std::thread worker_;
  void worker_loop();
  bool in_step_ = false;   // between begin() and finish()/cancel(); the caller's thread only
  bool job_ = false;       // guarded by mu_
  bool job_done_ = false;  // guarded by mu_
  bool stop_ = false;      // guarded by mu_
  Status worker_status_;   // written by the worker before job_done_
  double idle_s_ = 0;  // the stage's thread waiting for gradients to land
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::function<Status()>> ready_;  // guarded by mu_
  std::vector<bool> landed_;                    // guarded by mu_
  size_t released_ = 0;                         // guarded by mu_: chunks whose gradient buffers are free again
  bool abort_ = false;                          // guarded by mu_
};

}  // namespace strata::engine
