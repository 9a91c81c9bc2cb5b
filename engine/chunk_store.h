// ChunkStore: where every view of every chunk is, and the moves that bring
// a chunk's weights to the device and its gradient back.
//
// A chunk (a flat run of elements: for the built-in GPT, the embeddings,
// each block, the final layer norm) has five views — working weights
// (bf16 / fp16, or fp32), gradient, fp32 master, Adam m, Adam v — each
// with a home tier and a residency state that only the store changes:
//   on nvme -> loading -> on host -> copying -> on device   (weights going up)
//   dirty -> copying -> on host                              (a gradient coming back)
// Every transition is asynchronous and completes with an event: an NVMe
// read's ticket, a copy's gpu::Event; the consumer waits through the store
// (acquire, await_gradient), which then records the new state.
//
// The device side holds `prefetch_depth + 1` weight slots, two gradient
// slots and, resident for the whole step unless told otherwise
// (ChunkStoreOptions::resident_first), chunk 0 (the GPT's embeddings, used
// at both ends of the step) with its gradient — every byte from the
// device's budget. acquire() takes a reference on the slot holding a chunk's next use
// and issues the copies of the uses up to depth ahead in the order the first
// step recorded (AccessSchedule), each of which takes a reference too;
// release() drops it, and a slot nobody references is reused at once for
// the copy whose chunk is needed again farthest ahead (Belady's rule — the
// order is known), so a chunk still in a slot when it is used again costs no
// copy. A slot that is still referenced is never overwritten: the prefetch
// waits for a release, and a use that finds every slot referenced is
// ResourceExhausted.
//
// Weights homed on NVMe (set_nvme_weights) are read, by schedule position,
// into depth + 3 aligned host buffers up to depth + 2 uses ahead of their
// copy. The master weights and Adam states are moved by the optimizer stage
// (OptimizerStage, between NVMe and its staging buffers), which reports
// each move to the store (states_moved).
#pragma once

#include <array>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/dtype.h"
#include "engine/access_schedule.h"
#include "engine/pinned_arena.h"
#include "engine/tiers.h"
#include "engine/trace.h"
#include "gpu/device.h"
#include "io/swap_store.h"

namespace strata::engine {

enum class View : uint8_t { kWeights, kGradient, kMaster, kAdamM, kAdamV };
inline constexpr size_t kViews = 5;
std::string_view view_name(View view);

enum class Residency : uint8_t { kOnNvme, kLoading, kOnHost, kCopying, kOnDevice, kDirty };
std::string_view residency_name(Residency residency);

// The compute thread's waits: their total (the device's idle time) and, with
// a trace, a span for each on the "compute" track.
class WaitMeter {
 public:
  void set_trace(Trace* trace) { trace_ = trace; }
  Trace* trace() const { return trace_; }
  void reset() { wait_s_ = 0; }
  // false: waits are traced but not counted (the host waiting for the
  // device's compute, which is no stall of the device).
  void set_counting(bool counting) { counting_ = counting; }
  double seconds() const { return wait_s_; }
  static double now_s();
  // Counts the time since t0_s as a wait for `what`.
  void note(double t0_s, const char* what);
  Status wait(gpu::Device& device, gpu::Event event, const char* what);

 private:
  Trace* trace_ = nullptr;
  double wait_s_ = 0;
  bool counting_ = true;
};

struct ChunkStoreOptions {
  int prefetch_depth = 1;  // uses fetched ahead; depth + 1 weight slots
  DType dtype = DType::kF32;  // the working weights' and gradients' type on every tier
  // Per chunk, where a model keeps some chunks in another type (fp32 norms
  // beside bf16 matrices): each chunk's type. Empty: `dtype` for every chunk.
  std::vector<DType> chunk_dtypes;
  DType dtype_of(size_t chunk) const { return chunk_dtypes.empty() ? dtype : chunk_dtypes.at(chunk); }
  Tier states = Tier::kHost;  // the master weights' and Adam states' home (kHost or kNvme)
  io::BufferAllocator* host_memory = nullptr;  // staging for NVMe weights (null: page-aligned heap)
  // Micro-batches whose embedding gradients are held at once (the vertical
  // order: each micro-batch's is complete only after its embedding
  // backward, at the end of the step): chunk 0 has a gradient buffer per
  // micro-batch.
  int micro_batches = 1;
  // Chunk 0 resident on the device for the whole step with its own
  // gradient buffers (the GPT's embeddings, used at both ends of the step).
  // false: every chunk, chunk 0 too, goes through the weight and gradient
  // slots (a model of the caller's, through a Session).
  bool resident_first = true;
};

// The device bytes a chunk store allocates for chunks of these sizes:
// ChunkStore::create allocates exactly these, and the planner counts them
// from here.
struct ChunkStoreBytes {
  // Each allocation's bytes as the device charges them (gpu::device_allocation_bytes).
  uint64_t slot = 0;     // one weight or gradient slot: the largest chunk (in bytes) the slots serve
  int weight_slots = 0;  // prefetch_depth + 1
  int gradient_slots = 2;
  uint64_t resident = 0;            // chunk 0's weights (resident_first)
  uint64_t resident_gradients = 0;  // its gradient buffers, one per micro-batch
  uint64_t slots() const { return static_cast<uint64_t>(weight_slots) * slot; }
  uint64_t gradient_slot_bytes() const { return static_cast<uint64_t>(gradient_slots) * slot; }
  uint64_t total() const { return slots() + gradient_slot_bytes() + resident + resident_gradients; }
};
ChunkStoreBytes chunk_store_bytes(const std::vector<int64_t>& chunk_elems, const ChunkStoreOptions& options);

class ChunkStore {
 public:
  // `copy` is the stream the store's copies run on (the caller may share it);
  // `meter` counts the waits of acquire() and of the slots' reuse.
  static Result<std::unique_ptr<ChunkStore>> create(std::vector<int64_t> chunk_elems, gpu::Device& device,
                                                    gpu::Stream copy, WaitMeter* meter, ChunkStoreOptions options);
  ~ChunkStore();

  // Weights homed on NVMe: chunk c's working weights are the blobs
  // `blobs(c)` of `swap`, each read to its byte offset in the chunk (a
  // multiple of the store's alignment; the optimizer stage splits big
  // chunks into pieces); begin_step's host weights are then unused.
  struct BlobPiece {
    std::string blob;
    uint64_t offset_bytes = 0;
  };
  struct NvmeWeights {
    io::SwapStore* swap = nullptr;
    std::function<std::vector<BlobPiece>(size_t)> blobs;
  };
  Status set_nvme_weights(NvmeWeights source);

  // A new step over `host_weights` (one per chunk, in dtype; homed on the
  // host): nothing in a slot carries over (the weights changed), the
  // schedule starts at its first use, and chunk 0's copy to its resident
  // buffer is issued (read from NVMe first when homed there).
  // `same_weights`: another pass over the weights of the last one (the next
  // micro-batch of a step): the chunks still in slots, and chunk 0, are
  // used as they are — a resident model is not copied again, a streamed
  // one starts with the blocks backward left behind.
  Status begin_step(const std::vector<const void*>& host_weights, bool same_weights = false);
  // The step's last use was released: a step that recorded the order
  // becomes the one later steps replay.
  void end_step() {
    schedule_.end_step();
    passes_complete_ = true;  // the next pass over the same weights may keep the slots
  }
  // Waits for everything in flight (a failed step) and forgets it.
  void drain();
  // A pass whose uses the steps should not learn from (an evaluation):
  // begin_aside before its begin_step keeps the recorded order aside, and
  // end_aside (after drain) puts it back as it was.
  void begin_aside() { aside_ = schedule_; }
  void end_aside() {
    if (aside_) schedule_ = *aside_;
    aside_.reset();
  }

  // Chunk 0's weights on the device once its copy is done (resident for the
  // step; needs no acquire). FailedPrecondition without resident_first.
  Result<const void*> resident_weights();

  // A reference on `chunk`'s weights on the device, for its next use: the
  // copy was issued ahead when the schedule predicted it, or is issued now;
  // returns once it is done. Compute is synchronous: release a use before
  // acquiring the next one, unless the slots allow holding more.
  struct Use {
    size_t position = 0;  // in the step's order of uses
    const void* data = nullptr;
  };
  Result<Use> acquire(size_t chunk);
  void release(const Use& use);
  // The same, ordered on the device instead of on the host: acquire_async
  // does not wait for the copy but says by `ready` when it is done (the
  // model's stream waits for it); release_after gives the use back with
  // `done`, the event after the model's last read of the slot, which any
  // later copy into the slot waits for on the copy stream.
  Result<Use> acquire_async(size_t chunk, gpu::Event* ready);
  Status release_after(const Use& use, gpu::Event done);

  // Gradients. gradient_buffer(): where `chunk`'s gradient is computed on
  // the device (a free gradient slot; chunk 0's own buffer); its view turns
  // dirty. send_gradient(): once the compute that wrote it has finished (the
  // caller waited for it), copies it to `host_dst` on the copy stream; the
  // view is copying.
  // await_gradient() (any thread): waits for that copy; the view is on host.
  // `micro_batch` picks chunk 0's buffer (ChunkStoreOptions::micro_batches);
  // the other chunks' slots serve any micro-batch. The slots are handed out
  // in turn: asking for one whose gradient was not sent yet is
  // ResourceExhausted, naming that chunk, with nothing changed.
  Result<void*> gradient_buffer(size_t chunk, int micro_batch = 0);
  // The stream gradients go out on: the copy stream, unless given one of
  // their own (then a model's stream-ordered step does not queue weight
  // copies behind the wait for its gradients' compute).
  void set_gradient_stream(gpu::Stream stream) { grad_copy_ = stream; }
  gpu::Stream gradient_stream() const { return grad_copy_.id >= 0 ? grad_copy_ : copy_; }
  Status send_gradient(size_t chunk, void* host_dst, int micro_batch = 0);
  Status await_gradient(size_t chunk);

  // The optimizer stage moves the master weights and Adam states (one blob
  // per chunk, or per piece of a chunk bigger than the stage's sub-group:
  // OptimizerStage) and reports each move of a piece of chunk c's three
  // views here: loading (a read issued), on host (read, in a staging
  // buffer), dirty (updated there, not yet written back), on nvme (written,
  // or the step dropped the buffer). Any thread. set_state_pieces() says
  // how many pieces chunk c's states have (1 unless told).
  void set_state_pieces(size_t chunk, size_t pieces);
  void states_moved(size_t chunk, Residency now, size_t piece = 0);
  size_t state_pieces(size_t chunk) const;

  // A view's residency; the state views (master, m, v) per piece.
  Residency residency(size_t chunk, View view, size_t piece = 0) const;
  Tier home(size_t chunk, View view) const;

  // The order of chunk uses (writable for tests: a wrong order costs waiting, not bits).
  AccessSchedule& schedule() { return schedule_; }
  // The order the steps recorded (the one kept aside during a pass aside).
  const std::vector<size_t>& recorded_order() const { return aside_ ? aside_->order() : schedule_.order(); }
  // Uses of this step served by a slot that already held the chunk (no copy).
  uint64_t slot_hits() const { return slot_hits_; }
  uint64_t bytes_to_device() const { return h2d_bytes_; }
  uint64_t bytes_to_host() const { return d2h_bytes_; }
  // Host memory the store holds (the NVMe weights' staging).
  uint64_t host_bytes() const { return weight_arena_ ? weight_arena_->total_bytes() : 0; }

 private:
  ChunkStore() = default;
  static constexpr size_t kNoPosition = ~size_t{0};
  void set_state(size_t chunk, View view, Residency r);
  Residency weights_home_state() const { return nvme_ ? Residency::kOnNvme : Residency::kOnHost; }
  uint64_t bytes_of(size_t chunk) const { return static_cast<uint64_t>(elems_[chunk]) * es_[chunk]; }
  // The chunk used at position `pos` of this step, if known (the current use, or predicted).
  std::optional<size_t> chunk_at(size_t pos) const;
  // The next known position after `after` that uses `chunk` (kNoPosition: none known).
  size_t next_use(size_t chunk, size_t after) const;
  // Issues the copies of positions up to current + depth whose chunks are known.
  Result<Use> take(size_t chunk, gpu::Event* ready);
  Status issue_ahead(size_t current);
  // Chunk 0's gradient buffer of `micro_batch` (InvalidArgument past micro_batches_).
  Result<void*> embedding_gradient(int micro_batch);
  void drop_use(size_t pos);
  // NVMe weights: reads issued by position up to `through`; the host buffer
  // holding `chunk` for position `pos` once its read is done.
  Status read_weights_ahead(size_t through);
  Result<const void*> stage_nvme_weights(size_t pos, size_t chunk);
  // Issues the reads of `chunk`'s weight pieces into `buf`; waits for reads.
  Result<std::vector<io::Ticket>> read_weight_pieces(size_t chunk, const PinnedArena::Lease& buf);
  Status wait_reads(std::vector<io::Ticket>& reads, size_t chunk);
  void drain_weight_reads();

  std::vector<int64_t> elems_;  // each chunk's elements
  gpu::Device* dev_ = nullptr;
  gpu::Stream copy_{};
  gpu::Stream grad_copy_{};  // id < 0: the copy stream
  WaitMeter* meter_ = nullptr;
  int depth_ = 1;
  std::vector<uint64_t> es_;  // per chunk: bytes of one element of its working type
  Tier states_home_ = Tier::kHost;
  io::AlignedAllocator own_allocator_;
  io::BufferAllocator* allocator_ = &own_allocator_;

  // Residency of every (chunk, view); guarded by mu_ (gradients land on other threads).
  mutable std::mutex mu_;
  std::vector<std::array<Residency, 2>> state_;       // kWeights, kGradient (the first two views)
  std::vector<std::vector<Residency>> state_pieces_;  // master, m and v: one residency per piece, per chunk

  std::vector<const void*> host_weights_;
  AccessSchedule schedule_;
  std::optional<AccessSchedule> aside_;  // the recorded order, during a pass aside
  size_t cur_pos_ = kNoPosition, cur_chunk_ = 0;   // the newest use acquired
  size_t issued_ = 0;                              // positions whose copy has been submitted
  std::vector<gpu::DeviceMemory> slots_;           // depth + 1 weight buffers
  std::vector<std::optional<size_t>> slot_chunk_;  // the chunk each slot holds (or is being copied into)
  std::vector<gpu::Event> slot_ready_;             // the copy that filled each slot
  std::vector<gpu::Event> slot_free_;              // release_after's: the model's last read of each slot
  std::vector<size_t> pos_slot_;                   // the slot each issued position reads
  std::vector<int> slot_uses_;                     // references: issued uses not yet released, per slot
  uint64_t slot_hits_ = 0;
  bool passes_complete_ = false;                // the last pass ended (end_step): its slots hold what they say
  gpu::DeviceMemory resident_, resident_grad_;  // chunk 0's weights and gradient (one per micro-batch)
  int micro_batches_ = 1;
  bool resident_first_ = true;  // ChunkStoreOptions::resident_first
  size_t first_slotted() const { return resident_first_ ? 1 : 0; }  // the first chunk the slots serve
  gpu::Event resident_ready_;
  std::vector<gpu::DeviceMemory> grad_slots_;   // two gradient buffers
  std::vector<gpu::Event> grad_slot_done_;      // the last copy out of each
  std::vector<std::optional<size_t>> grad_slot_held_;  // the chunk whose gradient a slot holds, not yet sent
  size_t next_grad_slot_ = 0;
  std::vector<std::optional<size_t>> grad_slot_of_;  // chunk -> its gradient's slot this step (chunk 0: none, its own buffer)
  std::vector<gpu::Event> grad_copied_;              // chunk -> its gradient's copy; guarded by mu_
  uint64_t h2d_bytes_ = 0, d2h_bytes_ = 0;

  // Weights on NVMe.
  std::optional<NvmeWeights> nvme_;
  std::unique_ptr<PinnedArena> weight_arena_;
  std::vector<PinnedArena::Lease> weight_buf_;          // depth + 3, by schedule position
  std::vector<std::vector<io::Ticket>> weight_read_;  // one per weight_buf_: its pieces' reads (none: idle)
  std::vector<std::optional<size_t>> weight_read_chunk_;  // the chunk each read brings
  size_t weights_read_ = 0;                             // schedule positions whose read was issued
  std::vector<gpu::Event> weight_copied_;               // the last copy out of each weight_buf_
};

}  // namespace strata::engine
