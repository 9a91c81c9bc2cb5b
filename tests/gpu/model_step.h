// One training step's compute through gpu::ModelOps, driven the way the
// engine drives it: the embedding, every block keeping only its input, the
// head; then the head's backward, and each block recomputed from its input
// and back-propagated, the embedding last. Shared by the host and CUDA
// tests of ModelOps. All buffers are device memory of `dev`.
#pragma once

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "common/dtype.h"
#include "gpu/device.h"
#include "gpu/model_ops.h"

namespace strata::gpu::testing {

struct ModelStep {
  std::vector<DeviceMemory> weights, grads;  // per chunk (model_layout order), in the ops' dtype
  std::vector<DeviceMemory> x;               // block inputs: x[0] embeddings ... x[L] last block's output
  DeviceMemory dx, dx_in, recomputed, tokens, targets, loss;
};

inline Result<ModelStep> allocate_model_step(Device& dev, const ModelOps& ops, int64_t B, int64_t seq) {
  const GptConfig& c = ops.config();
  const uint64_t e = dtype_bytes(ops.dtype()), act = static_cast<uint64_t>(B * seq * c.hidden) * e;
  ModelStep m;
  for (const ChunkLayout& l : model_layout(c)) {
    STRATA_ASSIGN_OR_RETURN(DeviceMemory w, dev.allocate(static_cast<uint64_t>(l.numel) * e, "weights"));
    STRATA_ASSIGN_OR_RETURN(DeviceMemory g, dev.allocate(static_cast<uint64_t>(l.numel) * e, "gradients"));
    m.weights.push_back(std::move(w));
    m.grads.push_back(std::move(g));
  }
  for (int64_t l = 0; l <= c.layers; ++l) {
    STRATA_ASSIGN_OR_RETURN(DeviceMemory x, dev.allocate(act, "block input"));
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

// Enqueues the step on `s`; gradients are zeroed first, then set to
// dloss * d(loss)/d(weights); the loss lands in m.loss.
inline Status enqueue_model_step(ModelOps& ops, Stream s, ModelOps::Workspace& ws, ModelStep& m, float dloss) {
  const int64_t L = ops.config().layers;
  const size_t last = m.weights.size() - 1;
  const int32_t* tokens = m.tokens.as<int32_t>();
  const int32_t* targets = m.targets.as<int32_t>();
  STRATA_RETURN_IF_ERROR(ops.embedding_forward(s, ws, m.weights[0].data(), tokens, m.x[0].data()));
  for (int64_t l = 1; l <= L; ++l) {
    STRATA_RETURN_IF_ERROR(ops.block_forward(s, ws, m.weights[static_cast<size_t>(l)].data(),
                                             m.x[static_cast<size_t>(l - 1)].data(),
                                             m.x[static_cast<size_t>(l)].data()));
  }
  STRATA_RETURN_IF_ERROR(ops.head_forward(s, ws, m.weights[last].data(), m.weights[0].data(),
                                          m.x[static_cast<size_t>(L)].data(), targets, m.loss.as<float>()));
  for (DeviceMemory& g : m.grads) STRATA_RETURN_IF_ERROR(ops.zero(s, g.data(), g.bytes()));
  STRATA_RETURN_IF_ERROR(ops.zero(s, m.dx.data(), m.dx.bytes()));
  STRATA_RETURN_IF_ERROR(ops.head_backward(s, ws, m.weights[last].data(), m.grads[last].data(), m.weights[0].data(),
                                           m.grads[0].data(), m.x[static_cast<size_t>(L)].data(), targets, dloss,
                                           m.dx.data()));
  for (int64_t l = L; l >= 1; --l) {
    const void* p = m.weights[static_cast<size_t>(l)].data();
    const void* x_in = m.x[static_cast<size_t>(l - 1)].data();
    STRATA_RETURN_IF_ERROR(ops.block_forward(s, ws, p, x_in, m.recomputed.data()));
    STRATA_RETURN_IF_ERROR(ops.zero(s, m.dx_in.data(), m.dx_in.bytes()));
    STRATA_RETURN_IF_ERROR(
        ops.block_backward(s, ws, p, m.grads[static_cast<size_t>(l)].data(), x_in, m.dx.data(), m.dx_in.data()));
    std::swap(m.dx, m.dx_in);
  }
  return ops.embedding_backward(s, ws, m.grads[0].data(), tokens, m.dx.data());
}

// Uploads the weights (one host array per chunk, in the ops' dtype), the
// tokens and the targets on `s`, runs enqueue_model_step, and downloads the
// loss and every chunk's gradient (raw bytes of the ops' dtype), waiting
// for all of it; a failure of the device's background work is returned.
inline Result<float> run_model_step(Device& dev, ModelOps& ops, Stream s, ModelOps::Workspace& ws, ModelStep& m,
                                    const std::vector<const void*>& weights, const std::vector<int32_t>& tokens,
                                    const std::vector<int32_t>& targets, float dloss,
                                    std::vector<std::vector<uint8_t>>* grads) {
  // Chunk sizes from the layout: an allocation may be rounded up.
  const std::vector<ChunkLayout> layout = model_layout(ops.config());
  const uint64_t e = dtype_bytes(ops.dtype());
  for (size_t i = 0; i < weights.size(); ++i) {
    STRATA_RETURN_IF_ERROR(
        dev.copy_to_device(s, m.weights[i].data(), weights[i], static_cast<uint64_t>(layout[i].numel) * e));
  }
  STRATA_RETURN_IF_ERROR(dev.copy_to_device(s, m.tokens.data(), tokens.data(), tokens.size() * 4));
  STRATA_RETURN_IF_ERROR(dev.copy_to_device(s, m.targets.data(), targets.data(), targets.size() * 4));
  STRATA_RETURN_IF_ERROR(enqueue_model_step(ops, s, ws, m, dloss));
  float loss = 0;
  STRATA_RETURN_IF_ERROR(dev.copy_to_host(s, &loss, m.loss.data(), 4));
  grads->assign(m.grads.size(), {});
  for (size_t i = 0; i < m.grads.size(); ++i) {
    (*grads)[i].resize(static_cast<size_t>(layout[i].numel) * e);
    STRATA_RETURN_IF_ERROR(dev.copy_to_host(s, (*grads)[i].data(), m.grads[i].data(), (*grads)[i].size()));
  }
  STRATA_RETURN_IF_ERROR(dev.synchronize(s));
  STRATA_RETURN_IF_ERROR(dev.async_error());
  return loss;
}

// The fp32 values of n elements of `dtype` at `bytes`.
inline std::vector<float> values_of(const std::vector<uint8_t>& bytes, DType dtype) {
  const size_t n = bytes.size() / dtype_bytes(dtype);
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) {
    if (dtype == DType::kF32) {
      std::memcpy(&v[i], bytes.data() + 4 * i, 4);
    } else {
      uint16_t h;
      std::memcpy(&h, bytes.data() + 2 * i, 2);
      v[i] = dtype == DType::kBF16 ? bf16_to_f32(h) : f16_to_f32(h);
    }
  }
  return v;
}

// ||got - ref|| / ||ref||; infinity when ref is all zero, NaN when any
// element of got is not finite (so a comparison with a tolerance fails).
inline double relative_error(const std::vector<float>& got, const std::vector<float>& ref) {
  if (got.size() != ref.size()) return std::numeric_limits<double>::quiet_NaN();
  double diff = 0, norm = 0;
  for (size_t j = 0; j < got.size(); ++j) {
    if (!std::isfinite(got[j])) return std::numeric_limits<double>::quiet_NaN();
    diff += (static_cast<double>(got[j]) - ref[j]) * (static_cast<double>(got[j]) - ref[j]);
    norm += static_cast<double>(ref[j]) * ref[j];
  }
  return norm > 0 ? std::sqrt(diff / norm) : std::numeric_limits<double>::infinity();
}

}  // namespace strata::gpu::testing
