// One training step's compute through gpt::GptOps with every chunk
// resident in device memory: the embedding, every block keeping only its
// input, the head; then the head's backward, and each block recomputed from
// its input and back-propagated, the embedding last — the order the
// engine's streamed model runs them in, without any streaming. The
// reference driver for the tests and the compute part of strata-stepbench.
// All buffers are device memory of `dev`.
#pragma once

#include <utility>
#include <vector>

#include "common/dtype.h"
#include "gpu/device.h"
#include "models/gpt/gpt_ops.h"

namespace strata::gpt {

struct ModelStep {
  std::vector<gpu::DeviceMemory> weights, grads;  // per chunk (model_layout order), in the ops' dtype
  std::vector<gpu::DeviceMemory> x;               // block inputs: x[0] embeddings ... x[L] last block's output
  gpu::DeviceMemory dx, dx_in, recomputed, tokens, targets, loss;
};

inline Result<ModelStep> allocate_model_step(gpu::Device& dev, const GptOps& ops, int64_t B, int64_t seq) {
  const GptConfig& c = ops.config();
  const uint64_t e = dtype_bytes(ops.dtype()), act = static_cast<uint64_t>(B * seq * c.hidden) * e;
  ModelStep m;
  for (const ChunkLayout& l : model_layout(c)) {
    STRATA_ASSIGN_OR_RETURN(gpu::DeviceMemory w, dev.allocate(static_cast<uint64_t>(l.numel) * e, "weights"));
    STRATA_ASSIGN_OR_RETURN(gpu::DeviceMemory g, dev.allocate(static_cast<uint64_t>(l.numel) * e, "gradients"));
    m.weights.push_back(std::move(w));
    m.grads.push_back(std::move(g));
  }
  for (int64_t l = 0; l <= c.layers; ++l) {
    STRATA_ASSIGN_OR_RETURN(gpu::DeviceMemory x, dev.allocate(act, "block input"));
    m.x.push_back(std::move(x));
  }
  STRATA_ASSIGN_OR_RETURN(m.dx, dev.allocate(act, "dx"));
  STRATA_ASSIGN_OR_RETURN(m.dx_in, dev.allocate(act, "dx_in"));
  STRATA_ASSIGN_OR_RETURN(m.recomputed, dev.allocate(act, "recomputed block output"));
  STRATA_ASSIGN_OR_RETURN(m.tokens, dev.allocate(static_cast<uint64_t>(B * seq) * 4, "tokens"));
  STRATA_ASSIGN_OR_RETURN(m.targets, dev.allocate(static_cast<uint64_t>(B * seq) * 4, "targets"));
  STRATA_ASSIGN_OR_RETURN(m.loss, dev.allocate(4, "loss"));
  return m;
}

// Enqueues the forward on `s`: embedding, blocks (inputs kept in m.x), head;
// the loss lands in m.loss.
inline Status enqueue_model_forward(GptOps& ops, Stream s, GptOps::Workspace& ws, ModelStep& m) {
  const int64_t L = ops.config().layers;
  const size_t last = m.weights.size() - 1;
  STRATA_RETURN_IF_ERROR(ops.embedding_forward(s, ws, m.weights[0].data(), m.tokens.as<int32_t>(), m.x[0].data()));
  for (int64_t l = 1; l <= L; ++l) {
    STRATA_RETURN_IF_ERROR(ops.block_forward(s, ws, m.weights[static_cast<size_t>(l)].data(),
                                             m.x[static_cast<size_t>(l - 1)].data(),
                                             m.x[static_cast<size_t>(l)].data()));
  }
  return ops.head_forward(s, ws, m.weights[last].data(), m.weights[0].data(), m.x[static_cast<size_t>(L)].data(),
                          m.targets.as<int32_t>(), m.loss.as<float>());
}

// Enqueues the backward on `s` after enqueue_model_forward: gradients are
// zeroed, then set to dloss * d(loss)/d(weights), each block recomputed
// from its input first.
inline Status enqueue_model_backward(GptOps& ops, Stream s, GptOps::Workspace& ws, ModelStep& m, float dloss) {
  const int64_t L = ops.config().layers;
  const size_t last = m.weights.size() - 1;
  for (gpu::DeviceMemory& g : m.grads) STRATA_RETURN_IF_ERROR(ops.zero(s, g.data(), g.bytes()));
  STRATA_RETURN_IF_ERROR(ops.zero(s, m.dx.data(), m.dx.bytes()));
  STRATA_RETURN_IF_ERROR(ops.head_backward(s, ws, m.weights[last].data(), m.grads[last].data(), m.weights[0].data(),
                                           m.grads[0].data(), m.x[static_cast<size_t>(L)].data(),
                                           m.targets.as<int32_t>(), dloss, m.dx.data()));
  for (int64_t l = L; l >= 1; --l) {
    const void* p = m.weights[static_cast<size_t>(l)].data();
    const void* x_in = m.x[static_cast<size_t>(l - 1)].data();
    STRATA_RETURN_IF_ERROR(ops.block_forward(s, ws, p, x_in, m.recomputed.data()));
    STRATA_RETURN_IF_ERROR(ops.zero(s, m.dx_in.data(), m.dx_in.bytes()));
    STRATA_RETURN_IF_ERROR(
        ops.block_backward(s, ws, p, m.grads[static_cast<size_t>(l)].data(), x_in, m.dx.data(), m.dx_in.data()));
    std::swap(m.dx, m.dx_in);
  }
  return ops.embedding_backward(s, ws, m.grads[0].data(), m.tokens.as<int32_t>(), m.dx.data());
}

inline Status enqueue_model_step(GptOps& ops, Stream s, GptOps::Workspace& ws, ModelStep& m, float dloss) {
  STRATA_RETURN_IF_ERROR(enqueue_model_forward(ops, s, ws, m));
  return enqueue_model_backward(ops, s, ws, m, dloss);
}

}  // namespace strata::gpt
