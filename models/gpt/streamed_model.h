// StreamedModel: the whole GPT's forward and backward on a capped device
// (any gpu::Device; the trainer uses the host backend's HostDevice), with
// each block's weights brought to the device by the ChunkStore
// `prefetch_depth` uses ahead (in the order the first step recorded) on a
// copy stream while the current block computes, only block
// inputs kept between forward and backward (each block is recomputed in
// backward), and each block's gradient copied back to the host as soon as
// it is done (through the store too). The compute goes through the device's
// gpu::ModelOps on a compute stream (the host thread enqueues each block and
// waits for it, scheduling the copies around it). Every device byte — the
// store's weight and gradient slots, the ops' workspace, checkpoints — is
// allocated from the device, so its budget is exact. Block inputs (the
// activation checkpoints) stay on the device, or with `checkpoints` =
// Tier::kHost go to host memory as soon as they are written, through
// kCheckpointBuffers device buffers, and come back ahead of their block in
// backward; with Tier::kNvme they go on through two
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
#include "engine/chunk_store.h"
#include "engine/pinned_arena.h"
#include "engine/plan.h"
#include "engine/trace.h"
#include "gpu/device.h"
#include "gpu/model_ops.h"
#include "io/swap_store.h"

namespace strata::engine {

class StreamedModel {
 public:
  // `states`: where the optimizer states live (the store records their home).
  static Result<std::unique_ptr<StreamedModel>> create(const gpu::GptConfig& config, int64_t B, int64_t seq,
                                                       gpu::Device& device, int prefetch_depth,
                                                       Tier checkpoints = Tier::kDevice, io::SwapStore* swap = nullptr,
                                                       io::BufferAllocator* host_memory = nullptr,
                                                       DType dtype = DType::kF32, Tier states = Tier::kHost,
                                                       int micro_batches = 1);
  ~StreamedModel();

  // Called once per chunk, in backward order, when its gradient's copy to
  // the host has been issued; the host bytes are final once
  // await_gradient(chunk) returns.
  using GradLanded = std::function<void(size_t chunk)>;

  // One micro-batch (a model made with micro_batches = 1; otherwise
  // FailedPrecondition). Mean loss; `grads` (host, one per chunk, in
  // dtype()) are overwritten with dloss * d(mean loss)/d(weights). `weights`
  // are the host copies (in dtype()), in model_layout order.
  // `same_weights`: the weights are those of the last call (the next
  // micro-batch of a step), so what is still on the device is used as it is
  // (ChunkStore::begin_step).
  Result<float> forward_backward(const std::vector<const void*>& weights, const int32_t* tokens, const int32_t* targets,
                                 const std::vector<void*>& grads, const GradLanded& landed = {}, float dloss = 1.0f,
                                 bool same_weights = false);
  // One pass over create's micro_batches = V micro-batches: with V > 1 the
  // vertical order — each block's weights come to the device once and
  // compute every micro-batch (V sets of block gradients and embedding
  // gradients on the device, and V sets of block inputs: all on the device,
  // or, with checkpoints on the host or NVMe, kCheckpointBuffers groups of V
  // there, each group moved as one copy and one blob).
  // `tokens` and `targets` hold V micro-batches of B x seq, one after
  // another. Each chunk's gradient lands V times in a row, micro-batch by
  // micro-batch, into the same host buffer: `landed(chunk, k)` after
  // micro-batch k's copy was issued, and `before_resend()` before the copy
  // of micro-batch k >= 1 of the same chunk is issued — by then whatever the
  // caller does with the host buffer must be done (the compute of that
  // micro-batch ran meanwhile). Each micro-batch's gradients are the bits
  // the one-at-a-time order computes; `losses` gets the V mean losses.
  // `same_weights` as for forward_backward.
  using MicroBatchLanded = std::function<void(size_t chunk, int64_t micro_batch)>;
  Status forward_backward_pass(const std::vector<const void*>& weights, const int32_t* tokens, const int32_t* targets,
                               const std::vector<void*>& grads, const MicroBatchLanded& landed,
                               const std::function<Status()>& before_resend, float dloss, std::vector<float>* losses,
                               bool same_weights = false);
  int micro_batches() const { return micro_batches_; }
  // Called on the compute thread before each gradient's copy to its host
  // buffer is issued (once the buffer may be overwritten): the trainer's
  // ring of gradient buffers waits there for a free one. An error ends the
  // step. Empty: none.
  void set_gradient_gate(std::function<Status(size_t chunk)> gate) { gate_ = std::move(gate); }
  // Waits until `chunk`'s gradient of the step in flight is in its host
  // buffer (any thread; valid until the next forward_backward).
  Status await_gradient(size_t chunk) { return store_->await_gradient(chunk); }
  // The order in which backward finishes the chunks (what `landed` sees).
  static std::vector<size_t> landing_order(const gpu::GptConfig& config);

  // Weights homed on NVMe: chunk c's working weights (in dtype()) are read
  // from blob `blob(c)` of `swap` ahead of their copy (ChunkStore);
  // forward_backward's `weights` are then unused.
  using NvmeWeights = ChunkStore::NvmeWeights;
  Status set_nvme_weights(NvmeWeights source) { return store_->set_nvme_weights(std::move(source)); }
  // Seconds the last forward_backward's compute waited for copies and
  // NVMe reads (the device's idle time).
  double last_wait_seconds() const { return meter_.seconds(); }
  // Optional: spans of each block's compute and of every wait, on the
  // "compute" track.
  void set_trace(Trace* trace) { meter_.set_trace(trace); }

  // Host memory this model holds: checkpoints, staging arenas.
  uint64_t host_bytes() const;
  gpu::Device& device() { return *dev_; }
  DType dtype() const { return dtype_; }
  // Where each chunk's views are, and the moves of weights and gradients.
  ChunkStore& store() { return *store_; }
  const ChunkStore& store() const { return *store_; }

  // The order of chunk uses: recorded on the first step (whose weights are
  // fetched on demand), replayed by later steps, which fetch depth uses
  // ahead. Writable for tests (a wrong order costs waiting, not bits).
  AccessSchedule& schedule() { return store_->schedule(); }

  uint64_t bytes_to_device() const { return h2d_bytes_ + store_->bytes_to_device(); }
  // Uses of the last step whose chunk was still in a weight slot (no copy).
  uint64_t last_slot_hits() const { return store_->slot_hits(); }
  uint64_t bytes_to_host() const { return d2h_bytes_ + store_->bytes_to_host(); }

 private:
  StreamedModel() = default;
  // forward_backward_pass's body.
  Status run_step(const std::vector<const void*>& weights, const int32_t* tokens, const int32_t* targets,
                  const std::vector<void*>& grads, const MicroBatchLanded& landed,
                  const std::function<Status()>& before_resend, float dloss, float* losses, bool same_weights);
  // run_step's parts, in its order, and what they share: the caller's
  // buffers and hooks, and the step's device buffers.
  struct Pass {
    const std::vector<void*>* grads;
    const MicroBatchLanded* landed;
    const std::function<Status()>* before_resend;
    float dloss;
    std::vector<uint8_t*> dx, dx_in;  // per micro-batch: the gradient flowing down, swapped block by block
    std::vector<void*> emb_grad;      // per micro-batch: the tied embeddings' gradient
    float* loss = nullptr;            // per micro-batch
    int32_t* tokens = nullptr;
    int32_t* targets = nullptr;
    const void* emb = nullptr;  // the embeddings' weights, resident for the step
  };
  Status forward_blocks(Pass& p);
  Status head_backward(Pass& p);
  Status backward_block(Pass& p, int64_t l);
  Status embedding_backward(Pass& p);
  Status send_gradient(Pass& p, size_t chunk, int64_t m, const std::function<Status(void* slot)>& compute);
  // The block inputs (activation checkpoints) and their moves off the
  // device and back.
  uint8_t* block_input(int64_t m, int64_t l) const;
  uint64_t block_input_bytes() const;
  uint64_t input_group_bytes() const;
  bool moves_input(int64_t l) const;
  Status claim_input(int64_t l);
  Status drain_staging(int64_t l);
  Status offload_input(int64_t l);
  Status start_input_read(int64_t l);
  Status fetch_input(int64_t l);
  // Waits for everything a step put in flight and clears leftover errors.
  void settle();
  Status wait_for(gpu::Event e, const char* what) { return meter_.wait(*dev_, e, what); }
  // Enqueues compute on the compute stream and waits for it: the host thread
  // schedules the copies around each block, the device computes.
  Status run(const std::function<Status()>& enqueue);

  gpu::GptConfig config_;
  int64_t B_ = 0, T_ = 0;
  int micro_batches_ = 1;  // the vertical order's micro-batches per pass
  std::function<Status(size_t chunk)> gate_;  // set_gradient_gate
  gpu::Device* dev_ = nullptr;
  gpu::Stream copy_{};
  std::vector<gpu::ChunkLayout> layout_;
  DType dtype_ = DType::kF32;
  uint64_t es_ = 4;  // bytes of one element of dtype_
  WaitMeter meter_;
  std::unique_ptr<ChunkStore> store_;  // weights and gradients between the tiers
  gpu::DeviceMemory checkpoints_, step_mem_;
  std::unique_ptr<gpu::ModelOps> ops_;
  std::unique_ptr<gpu::ModelOps::Workspace> workspace_;
  gpu::Stream compute_{};
  Tier checkpoint_tier_ = Tier::kDevice;
  std::vector<uint8_t> host_checkpoints_;  // (L + 1) block inputs when on the host
  gpu::Event ckpt_done_[kCheckpointBuffers];  // last copy out of / into each device checkpoint buffer
  gpu::Event stage_done_[2];                  // last copy out of / into each NVMe staging buffer
  io::SwapStore* swap_ = nullptr;        // checkpoints on NVMe
  std::vector<std::string> checkpoint_blobs_;  // their blobs' names, block input l at l
  io::AlignedAllocator own_allocator_;
  io::BufferAllocator* allocator_ = &own_allocator_;  // the staging arenas' host memory
  std::unique_ptr<PinnedArena> staging_;
  std::vector<PinnedArena::Lease> stage_buf_;      // two, for checkpoints on NVMe
  std::optional<io::Ticket> stage_write_[2];       // last write from each
  std::optional<io::Ticket> stage_read_[2];        // a block input on its way back
  uint64_t h2d_bytes_ = 0, d2h_bytes_ = 0;         // block inputs (the store counts weights and gradients)
  // Last, so they are released before the vectors they pin.
  gpu::HostPin checkpoint_pin_;  // host_checkpoints_
};

}  // namespace strata::engine
