// gpt::GptOps: the GPT's compute on one gpu::Device, behind one interface
// for every backend. The backends' single ops (gpu/host/ops.h,
// gpu/cuda/ops.h) are
// composed into the pieces a training step drives: the embedding, one
// transformer block (forward; backward after a forward of the same block on
// the same workspace — the recompute), and the head (final LayerNorm, the
// tied output projection and cross-entropy, never holding more than one
// chunk of logits).
//
// Every call is enqueued on a stream of the device and runs after what was
// submitted to that stream before, like a CUDA launch; a bad argument is
// returned at once, a failure of the work itself through the device
// (async_error() on the host backend, the next synchronize on CUDA).
// Tensors are device memory in dtype() — fp32, bf16 or fp16, every op
// computing and accumulating in fp32 — laid out as gpt_config.h's chunks
// ([B*T, C] activations); token ids are device int32 [B, T]; the loss is one
// device fp32. Backward calls accumulate (+=) into their gradient outputs.
#pragma once

#include <cstdint>
#include <memory>

#include "common/dtype.h"
#include "common/status.h"
#include "gpu/device.h"
#include "models/gpt/gpt_config.h"

namespace strata::gpt {

using gpu::Stream;

class GptOps {
 public:
  // One step's device working memory for B x seq rows: one block's saved
  // tensors and backward scratch (shared by every block in turn) and the
  // head's. Allocated from the device's budget.
  class Workspace {
   public:
    virtual ~Workspace() = default;
    int64_t batch() const { return B_; }
    int64_t seq() const { return T_; }

   protected:
    Workspace(int64_t B, int64_t seq) : B_(B), T_(seq) {}

   private:
    int64_t B_, T_;
  };

  virtual ~GptOps() = default;
  virtual DType dtype() const = 0;
  virtual const GptConfig& config() const = 0;

  // Bytes workspace(B, seq) takes from the device (what a planner counts).
  virtual uint64_t workspace_bytes(int64_t B, int64_t seq) const = 0;
  virtual Result<std::unique_ptr<Workspace>> workspace(int64_t B, int64_t seq) = 0;

  // x_out[N,C] = wte[tokens] + wpe[t] from the embedding chunk.
  virtual Status embedding_forward(Stream s, Workspace& ws, const void* embedding, const int32_t* tokens,
                                   void* x_out) = 0;
  // dembedding (same layout) += the gradient for dx[N,C].
  virtual Status embedding_backward(Stream s, Workspace& ws, void* dembedding, const int32_t* tokens,
                                    const void* dx) = 0;
  // x_out = block(x_in) with the block chunk `params`; saves what backward needs in ws.
  virtual Status block_forward(Stream s, Workspace& ws, const void* params, const void* x_in, void* x_out) = 0;
  // After block_forward(params, x_in) on ws: dparams += and dx_in += the gradients for dx_out.
  virtual Status block_backward(Stream s, Workspace& ws, const void* params, void* dparams, const void* x_in,
                                const void* dx_out, void* dx_in) = 0;
  // *loss = mean cross-entropy of targets given the last block's output x,
  // through the final chunk's LayerNorm and the tied projection (the
  // embedding chunk's wte).
  virtual Status head_forward(Stream s, Workspace& ws, const void* final_chunk, const void* embedding,
                              const void* x, const int32_t* targets, float* loss) = 0;
  // After head_forward on ws: dfinal +=, dembedding (its wte) += and dx +=
  // the gradients of dloss * loss.
  virtual Status head_backward(Stream s, Workspace& ws, const void* final_chunk, void* dfinal,
                               const void* embedding, void* dembedding, const void* x, const int32_t* targets,
                               float dloss, void* dx) = 0;
  // bytes of device memory at `data` set to zero bits (+0 in every dtype).
  virtual Status zero(Stream s, void* data, uint64_t bytes) = 0;
};

}  // namespace strata::gpt
