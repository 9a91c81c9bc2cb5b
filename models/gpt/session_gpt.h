// SessionGpt: the built-in GPT as a client of the engine's session — the
// same model as the trainer's (GPT-2's chunks, initial weights and
// synthetic data: gpt_init.h), driven through engine::Session's calls
// alone, as a model of a user's would be. The session owns every byte of
// model state and decides where it lives (weights and optimizer states in
// RAM or on NVMe, gradients summed over the micro-batches); this class
// owns only the compute: the device's ModelOps, its workspace, the block
// inputs kept for backward (on the device, or handed to the session's
// save_activation, and brought back by prefetch_activation a block ahead
// of their use), and the gradient flowing down.
//
// A step runs the session's grad_accum micro-batches one after another:
// per micro-batch, the embedding, each block (acquire, forward, release),
// the head; then backward from the head down, each block's forward
// recomputed from its input and its gradient submitted as soon as it is
// computed; the embeddings' gradient (tied: the head adds to it) last.
// The first chunk, the embeddings, stays on the device for the step
// (SessionOptions::resident_first). The compute is queued on one stream
// and the weights are acquired, released and gradients submitted on it
// (the session's stream-ordered calls), so the host runs ahead of the
// device; it waits for the compute where it needs its results (the
// losses, a step's end or failure), before handing a block input to the
// session or taking one back, and after each op when traced. The same
// seed and data give the same bits in every placement, and the losses
// recorded before the GPT moved onto the session
// (tests/models/gpt/session_gpt_test.cpp). One thread drives it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "cpu_optim/executor.h"
#include "engine/session.h"
#include "models/gpt/gpt_config.h"
#include "models/gpt/gpt_ops.h"

namespace strata::engine {

struct SessionGptOptions {
  gpt::GptConfig model;
  int64_t batch = 2;
  int64_t seq = 16;
  uint64_t seed = 1;  // the initial weights and the synthetic stream
  // Block inputs between forward and backward: on the device (L + 1 of
  // them, from the session's budget), or handed to the session (two on the
  // device; the rest wait where SessionOptions::activations says).
  bool offload_activations = false;
  // Micro-batches computed together (a divisor of the session's
  // grad_accum; 0: all of them): 1 runs them one after another; more runs
  // the vertical order — each block's weights acquired once for all of them
  // (fetched once a step instead of once a micro-batch), at the price of
  // that many block inputs, gradients flowing down and embedding
  // gradients on the device. The same bits either way.
  int64_t micro_batches_per_pass = 1;
  // Asked before each block of forward and of backward (null: never): true
  // cancels the step there — the session's cancel_step, every weight and
  // state as before it — and step() returns Cancelled. A stop that cannot
  // wait for a long step's end.
  std::function<bool()> stop;
};

class SessionGpt {
 public:
  // Registers the GPT's chunks with `session` (not started; made with
  // resident_first and the working type the model computes in), GPT-2's
  // initial weights drawn from the seed, and each chunk's tensors under
  // their GPT-2 names (the session's checkpoints save them so); takes the
  // model's device memory from its budget. The session is left unstarted:
  // the first step starts it (drawing the initial weights), or a
  // Session::load before it resumes without drawing them — nothing
  // initial is computed or written. `session` must outlive this.
  static Result<std::unique_ptr<SessionGpt>> create(Session& session, const SessionGptOptions& options);
  ~SessionGpt();

  // One step on the caller's data: grad_accum micro-batches of batch x seq
  // tokens ([grad_accum][batch][seq], row-major) and as many targets.
  // Returns the mean loss. InvalidArgument, nothing changed, for a wrong
  // count or a token outside the vocabulary; a failure after the step
  // began cancels it (nothing of it is applied).
  Result<float> step(std::span<const int32_t> tokens, std::span<const int32_t> targets);
  // One step on the synthetic stream: micro-batches steps_done x
  // grad_accum onwards, as the trainer reads it.
  Result<float> step();
  // The session's verdict on the last step.
  const StepVerdict& last_verdict() const { return verdict_; }
  // Seconds the last step waited in end_step for the optimizer's update
  // (what the overlap with backward did not hide).
  double last_update_wait_seconds() const { return update_wait_s_; }
  const std::vector<gpt::ChunkLayout>& layout() const { return layout_; }

 private:
  SessionGpt() = default;
  Status allocate();
  Status run_step(const int32_t* tokens, const int32_t* targets, double* loss_sum);
  Status check_stop(const char* pass, int64_t block) const;
  // A pass: pass_ micro-batches from micro-batch k0 of the step on; each
  // loss into loss_[k0 + m].
  Status pass(const int32_t* tokens, const int32_t* targets, int64_t k0);
  Status forward(const void* emb);
  Status head_backward(const void* emb, const std::vector<void*>& emb_grad, int64_t k0);
  Status backward_block(int64_t l);
  Status embedding_backward(const std::vector<void*>& emb_grad);
  // Enqueues on the compute stream and waits: the session's copies are
  // ordered around each piece of compute.
  // `what` (and `block`, >= 0): its span on the session's trace's
  // "compute" track.
  Status run(const std::function<Status()>& enqueue, const char* what = nullptr, int64_t block = -1);
  // Micro-batch m's block input l (l = 0 is the embedding's output) on the device.
  uint8_t* input(int64_t m, int64_t l) const;
  uint64_t input_bytes() const;
  uint64_t chunk_bytes(size_t chunk) const;
  Status save_input(int64_t l);
  Status input_saved(int64_t l);
  Status prefetch_input(int64_t l);
  Status load_input(int64_t l);

  Session* session_ = nullptr;
  SessionGptOptions options_;
  std::vector<gpt::ChunkLayout> layout_;
  uint64_t es_ = 2;  // bytes of one working element
  std::unique_ptr<gpt::GptOps> ops_;
  std::unique_ptr<gpt::GptOps::Workspace> workspace_;
  gpu::Stream compute_{};
  int64_t pass_ = 1;             // micro-batches per pass
  gpu::DeviceMemory inputs_;     // block inputs: L + 1 per micro-batch of a pass, or two when offloaded
  gpu::DeviceMemory step_mem_;   // per micro-batch of a pass dx, dx_in; the step's losses; the pass's tokens, targets
  gpu::DeviceMemory emb_grads_;  // the embeddings' gradients of a pass's micro-batches after the first
  std::vector<uint8_t*> dx_, dx_in_;  // per micro-batch of the pass
  float* loss_ = nullptr;             // one per micro-batch of the step
  int32_t* tokens_ = nullptr;         // the pass's
  int32_t* targets_ = nullptr;
  StepVerdict verdict_;
  double update_wait_s_ = 0;
};

}  // namespace strata::engine
