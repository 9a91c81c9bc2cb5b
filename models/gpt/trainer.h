// Trainer: the GPT training loop on a compute device — the host backend
// (the CPU, optionally capped like a GPU) or a CUDA GPU — end to end, as a
// client of the engine's session: the session (engine/session.h) owns
// every byte of model state and the optimizer stage (master weights and
// Adam states in host memory or on NVMe), SessionGpt computes forward and
// backward through the session's calls in the working weights' type (bf16
// or fp16), and the trainer adds its options, the data stream's position,
// its counters and checkpoint/resume through safetensors (trainer.json).
// The working weights stay resident (a device slot per block), or stream
// block by block through a capped device; the data is a deterministic
// synthetic stream (next token = token + stride), so a run is reproducible
// from its seed and its loss can fall.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "cpu_optim/executor.h"
#include "cpu_optim/optimizer.h"
#include "engine/loss_scaler.h"
#include "engine/lr_schedule.h"
#include "engine/optimizer_stage.h"
#include "engine/session.h"
#include "engine/trace.h"
#include "gpu/device.h"
#include "models/gpt/gpt_config.h"
#include "io/swap_store.h"
#include "models/gpt/session_gpt.h"
#include "models/gpt/trainer_options.h"

namespace strata::engine {

class CheckpointDir;
class SafetensorsReader;
class SafetensorsWriter;

// Where the last step's time went (seconds, wall clock, one after another).
// The optimizer stage runs beside forward+backward; `optimizer` is what is
// left of it after backward (the part the overlap did not hide).
struct StepTimes {
  double forward_backward = 0;  // including weight streaming when on
  double optimizer = 0;         // waiting for the optimizer stage after backward
};

// What the last step moved, per link, and how busy the device was.
struct StepCounters {
  uint64_t h2d_bytes = 0, d2h_bytes = 0;  // weights, gradients and block inputs
  uint64_t nvme_read_bytes = 0;           // every NVMe byte: states, weights, saved activations
  uint64_t nvme_written_bytes = 0;        // the SSD's endurance meter
  double device_wait_s = 0;               // the compute stream stalled for copies and NVMe (streaming)
  double device_idle_fraction = 0;        // device_wait_s / forward+backward time
};

class Trainer {
 public:
  static Result<std::unique_ptr<Trainer>> create(const TrainerOptions& options);
  ~Trainer();

  // One optimizer step on the next batch of the synthetic stream; returns
  // its loss.
  Result<float> step();
  // One optimizer step on the caller's data: grad_accum micro-batches of
  // batch x seq tokens each, row-major ([grad_accum][batch][seq]), and as
  // many targets (the next token of each). InvalidArgument, with nothing
  // changed, for a wrong count or a token or target outside the vocabulary.
  // The step counts as any other (the synthetic stream is indexed by the
  // step number, and a checkpoint's data_position is steps x grad_accum).
  Result<float> step(std::span<const int32_t> tokens, std::span<const int32_t> targets);
  int64_t steps_done() const { return session_->steps_done(); }
  // Optimizer updates applied: steps_done() less the fp16 steps skipped for
  // an inf/nan gradient. Adam's step count (its bias correction) and the
  // learning-rate schedule follow it, as torch's Adam behind a GradScaler and
  // DeepSpeed (which does not step its scheduler on an overflow) do.
  int64_t updates_done() const { return session_->updates_done(); }
  // What the last step's optimizer stage moved (NVMe bytes, seconds).
  const StageCounters& last_stage() const { return gpt_->last_verdict().update; }
  // The last step's global gradient norm (before clipping), whether it was
  // clipped, and whether it was skipped (an inf/nan gradient anywhere: no
  // chunk is updated; the step still counts, in the data position and in
  // the optimizer's step number).
  double last_grad_norm() const { return gpt_->last_verdict().grad_norm; }
  // The learning rate of the last step's update (lr_schedule at its step).
  double last_lr() const { return gpt_->last_verdict().lr; }
  bool last_clipped() const { return gpt_->last_verdict().clipped; }
  bool last_skipped() const { return gpt_->last_verdict().skipped; }
  // Whether the last step's speculative updates were undone (clipping or
  // inf/nan the guess did not foresee), and how often that happened so far.
  bool last_rolled_back() const { return gpt_->last_verdict().rolled_back; }
  int64_t rollbacks() const { return rollbacks_; }
  // fp16: the loss scale the next step will use.
  double loss_scale() const { return session_->loss_scale(); }
  // The NVMe store of everything on NVMe (null when nothing is); tests
  // reach its fault injector through it.
  io::SwapStore* swap_store() { return session_->swap_store(); }
  // Chunks whose weights a failed step updated in place and that could not
  // be put back yet (the next step() or save() does it first).
  size_t chunks_to_restore() const { return session_->chunks_to_restore(); }
  const OptimizerStage& optimizer_stage() const { return session_->optimizer_stage(); }
  const StepTimes& last_times() const { return last_times_; }
  const StepCounters& last_counters() const { return last_counters_; }
  // Host memory the trainer holds, summed from its buffers and arenas:
  // gradients, weights, host states, saved activations, staging.
  uint64_t host_bytes() const;
  // Chunk c's fp32 master weights (model_layout order) into dst: what an
  // evaluation on the CPU reads. Waits for an update in flight.
  Status read_master(size_t chunk, float* dst);
  // The device the model computes on (capped when streaming).
  const gpu::Device* device() const { return &session_->device(); }

  // Lands the work in flight — a delayed update, the device's background
  // tasks — and reports the first failure among it (what a destructor
  // cannot). The trainer stays usable.
  Status finalize();
  // Without waiting: the failure of background work not yet reported —
  // the delayed update in flight, or the last one, which failed and is
  // begun again by the next step — else OK. Any thread.
  Status async_error();
  // Writes <root>/step-<t> (model.safetensors with GPT-2 names in bf16,
  // optimizer.safetensors with every chunk's fp32 master/m/v, trainer.json)
  // by the CheckpointDir protocol.
  Status save(const std::string& root);
  // The same through the caller's CheckpointDir, whose writer lock the
  // caller may hold for a whole run (CheckpointDir::lock()).
  Status save(CheckpointDir& dir);
  // Restores the latest checkpoint under root; the model config must match.
  Status load(const std::string& root);

 private:
  Trainer() = default;
  Status write_checkpoint(CheckpointDir& dir);
  // write_checkpoint's trainer.json into the checkpoint's .tmp directory.
  Status write_record(const std::string& tmp, const SafetensorsWriter& model, const SafetensorsWriter& opt) const;
  // step()'s body: on the caller's micro-batches, or (null) the synthetic stream's.
  Result<float> run_step(const int32_t* tokens, const int32_t* targets);
  // options_.progress, when set.
  void report(std::string_view what, int64_t done, int64_t total) const;
  // A checkpoint's trainer.json, checked against this trainer (model,
  // accumulation, precision, state type, loss scale, step counts).
  struct CheckpointMeta {
    int64_t step = 0, updates = 0;
    LossScaler::State loss_scale;
    std::map<std::string, std::pair<uint64_t, std::string>> files;  // name -> (bytes, header digest)
  };
  // `legacy`: the record has no seal (written before checkpoints had checksums).
  Result<CheckpointMeta> checkpoint_meta(const std::string& path, bool* legacy) const;
  Result<CheckpointMeta> checked_meta(const std::string& path, const nlohmann::json& meta) const;
  // load()'s checks of the whole checkpoint before it replaces anything.
  Status verify_checkpoint(const std::string& path, const CheckpointMeta& meta, bool legacy,
                           const SafetensorsReader& model, const SafetensorsReader& opt) const;

  TrainerOptions options_;
  // The GPT's chunks, as the model on the session lays them out.
  const std::vector<gpt::ChunkLayout>& layout() const { return gpt_->layout(); }
  // The engine's session owns every byte of model state and the optimizer;
  // the GPT drives it (models/gpt/session_gpt.h). The trainer adds the
  // data stream's position, its checkpoint record, the learning-rate
  // schedule's view and the step's counters.
  std::unique_ptr<Session> session_;
  std::unique_ptr<SessionGpt> gpt_;
  // Created without initial weights and states (initial_state false):
  // step() and save() refuse until a load succeeds.
  bool unset_ = false;
  int64_t rollbacks_ = 0;
  StepTimes last_times_;
  StepCounters last_counters_;
};

}  // namespace strata::engine
