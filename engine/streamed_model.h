// StreamedModel: the whole GPT's forward and backward on a capped device
// (any gpu::Device; the trainer uses the host backend's HostDevice), with
// each block's weights streamed in from host memory `prefetch_depth` uses
// ahead (in the order the first step recorded: AccessSchedule) on a copy
// stream while the current block computes, only block
// inputs kept between forward and backward (each block is recomputed in
// backward), and each block's gradient copied back to the host as soon as
// it is done. The compute goes through the device's gpu::ModelOps on a
// compute stream (the host thread enqueues each block and waits for it,
// scheduling the copies around it). Every device byte — weight slots,
// gradient slots, the ops' workspace, checkpoints — is allocated from the
// device, so its budget is exact. The embedding chunk stays resident (it is
// used at both ends of the step). Block inputs (the activation checkpoints)
// stay on the device, or with `checkpoints` = Tier::kHost go to host memory
// as soon as they are written, through two device buffers, and come back
// one block ahead in backward; with Tier::kNvme they go on through two
// aligned host buffers into `swap` blobs (the write issued in the copy
// stream's order through Device::enqueue) and are read back the same way.
// Everything on the device — weights, gradients, block inputs — is in the
// model's dtype (the trainer's bf16 or fp16 working weights, copied up as
// they are; fp32 gives the same bits as HostGpt, tested); host weights and
// gradients are in that dtype too.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/access_schedule.h"
#include "engine/pinned_arena.h"
#include "engine/plan.h"
#include "engine/trace.h"
#include "gpu/device.h"
#include "gpu/model_ops.h"
#include "io/swap_store.h"

namespace strata::engine {

class StreamedModel {
 public:
  static Result<std::unique_ptr<StreamedModel>> create(const gpu::GptConfig& config, int64_t B, int64_t seq,
                                                       gpu::Device& device, int prefetch_depth,
                                                       Tier checkpoints = Tier::kDevice,
                                                       io::SwapStore* swap = nullptr,
                                                       io::BufferAllocator* host_memory = nullptr,
                                                       DType dtype = DType::kF32);
  ~StreamedModel();

  // Called once per chunk, in backward order, when its gradient's copy to
  // the host has been issued; the host bytes are final once `copied` is done.
  using GradLanded = std::function<void(size_t chunk, gpu::Event copied)>;

  // Mean loss; `grads` (host, one per chunk, in dtype()) are overwritten
  // with dloss * d(mean loss)/d(weights). `weights` are the host copies (in
  // dtype()), in model_layout order.
  Result<float> forward_backward(const std::vector<const void*>& weights, const int32_t* tokens,
                                 const int32_t* targets, const std::vector<void*>& grads,
                                 const GradLanded& landed = {}, float dloss = 1.0f);
  // The order in which backward finishes the chunks (what `landed` sees).
  static std::vector<size_t> landing_order(const gpu::GptConfig& config);

  // Weights homed on NVMe: chunk c's working weights (in dtype()) are read
  // from blob `blob(c)` of `swap` up to depth + 2 schedule positions ahead
  // of their copy, through depth + 3 aligned host buffers the copies read
  // from; forward_backward's `weights` are then unused.
  struct NvmeWeights {
    io::SwapStore* swap = nullptr;
    std::function<std::string(size_t)> blob;
  };
  Status set_nvme_weights(NvmeWeights source);
  // Seconds the last forward_backward's compute waited for copies and
  // NVMe reads (the device's idle time).
  double last_wait_seconds() const { return wait_s_; }
  // Optional: spans of each block's compute and of every wait, on the
  // "compute" track.
  void set_trace(Trace* trace) { trace_ = trace; }

  // Host memory this model holds: checkpoints, staging arenas, widened weights.
  uint64_t host_bytes() const;
  gpu::Device& device() { return *dev_; }
  DType dtype() const { return dtype_; }

  // The order of chunk uses: recorded on the first step (whose weights are
  // fetched on demand), replayed by later steps, which fetch depth uses
  // ahead. Writable for tests (a wrong order costs waiting, not bits).
  AccessSchedule& schedule() { return schedule_; }

  uint64_t bytes_to_device() const { return h2d_bytes_; }
  // Uses of the last step whose chunk was still in a weight slot (no copy).
  uint64_t last_slot_hits() const { return slot_hits_; }
  uint64_t bytes_to_host() const { return d2h_bytes_; }

 private:
  StreamedModel() = default;
  Result<float> run_step(const std::vector<const void*>& weights, const int32_t* tokens, const int32_t* targets,
                         const std::vector<void*>& grads, const GradLanded& landed, float dloss);
  // Waits for everything a step put in flight and clears leftover errors.
  void settle();
  // The device copy of `chunk`'s weights for its next use: fetched now if
  // the schedule did not predict it, already on its way if it did; the
  // uses after it that the schedule knows are issued up to depth ahead.
  Result<const void*> weights_for(size_t chunk);
  // Drops the reference the use at `pos` holds on its slot.
  void drop_use(size_t pos);
  // Issues the copies of positions up to current + depth whose chunks are known.
  Status issue_ahead(size_t current);
  // The chunk used at position `pos` of this step, if known (the current use, or predicted).
  std::optional<size_t> chunk_at(size_t pos) const;
  // The next known position after `after` that uses `chunk` (kNoPosition: none known).
  size_t next_use(size_t chunk, size_t after) const;
  // NVMe weights: the host buffer holding `chunk`, used at position `pos`,
  // once its read is done.
  Result<const void*> stage_nvme_weights(size_t pos, size_t chunk);
  Status read_weights_ahead(size_t through);
  Status wait_for(gpu::Event e, const char* what);
  // Enqueues compute on the compute stream and waits for it: the host thread
  // schedules the copies around each block, the device computes.
  Status run(const std::function<Status()>& enqueue);
  double now_s() const;
  void note_wait(double t0_s, const char* what);
  void drain_weight_reads();

  gpu::GptConfig config_;
  int64_t B_ = 0, T_ = 0;
  gpu::Device* dev_ = nullptr;
  gpu::Stream copy_{};
  int depth_ = 1;
  std::vector<gpu::ChunkLayout> layout_;
  std::vector<const void*> host_weights_;
  DType dtype_ = DType::kF32;
  uint64_t es_ = 4;  // bytes of one element of dtype_
  AccessSchedule schedule_;       // the chunks' order of use, recorded on the first step
  static constexpr size_t kNoPosition = ~size_t{0};
  size_t cur_pos_ = kNoPosition, cur_chunk_ = 0;  // the use being served
  size_t issued_ = 0;             // positions whose copy has been submitted
  std::vector<gpu::DeviceMemory> slots_;      // depth + 1 weight buffers
  std::vector<std::optional<size_t>> slot_chunk_;  // the chunk each slot holds (or is being copied into)
  std::vector<gpu::Event> slot_ready_;             // the copy that filled each slot
  std::vector<size_t> pos_slot_;                   // the slot each issued position reads
  std::vector<int> slot_uses_;                     // issued uses not yet computed, per slot (its references)
  uint64_t slot_hits_ = 0;                         // uses served without a copy, this step
  std::vector<gpu::DeviceMemory> grad_slots_; // 2 gradient buffers
  std::vector<gpu::Event> grad_done_;         // last D2H from each gradient slot
  gpu::DeviceMemory embedding_, embedding_grad_, checkpoints_, step_mem_;
  std::unique_ptr<gpu::ModelOps> ops_;
  std::unique_ptr<gpu::ModelOps::Workspace> workspace_;
  gpu::Stream compute_{};
  Tier checkpoint_tier_ = Tier::kDevice;
  std::vector<uint8_t> host_checkpoints_;  // (L + 1) block inputs when on the host
  gpu::Event ckpt_done_[kCheckpointBuffers];  // last copy out of / into each device checkpoint buffer
  gpu::Event stage_done_[2];                  // last copy out of / into each NVMe staging buffer
  io::SwapStore* swap_ = nullptr;        // checkpoints on NVMe
  io::AlignedAllocator own_allocator_;
  io::BufferAllocator* allocator_ = &own_allocator_;  // the staging arenas' host memory
  std::unique_ptr<PinnedArena> staging_;
  std::vector<PinnedArena::Lease> stage_buf_;      // two, for checkpoints on NVMe
  std::optional<io::Ticket> stage_write_[2];       // last write from each
  std::optional<io::Ticket> stage_read_[2];        // a block input on its way back
  uint64_t h2d_bytes_ = 0, d2h_bytes_ = 0;
  // Weights on NVMe.
  std::optional<NvmeWeights> nvme_weights_;
  std::unique_ptr<PinnedArena> weight_arena_;
  std::vector<PinnedArena::Lease> weight_buf_;          // depth + 3, by schedule position
  std::vector<std::optional<io::Ticket>> weight_read_;  // one per weight_buf_
  size_t weights_read_ = 0;                             // schedule positions whose read was issued
  std::vector<gpu::Event> weight_copied_;               // the last copy out of each weight_buf_
  Trace* trace_ = nullptr;
  double wait_s_ = 0;
  // Last, so they are released before the vectors they pin.
  gpu::HostPin checkpoint_pin_;  // host_checkpoints_
};

}  // namespace strata::engine
