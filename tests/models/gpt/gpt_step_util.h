// Test helpers around models/gpt/gpt_step.h: upload a model, run a resident step
// through GptOps, download what it produced, and compare it.
#pragma once

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "common/dtype.h"
#include "models/gpt/gpt_step.h"

namespace strata::gpt::testing {

// Uploads the weights (one host array per chunk, in the ops' dtype), the
// tokens and the targets on `s`, runs enqueue_model_step, and downloads the
// loss and every chunk's gradient (raw bytes of the ops' dtype), waiting
// for all of it; a failure of the device's background work is returned.
inline Result<float> run_model_step(gpu::Device& dev, GptOps& ops, Stream s, GptOps::Workspace& ws, ModelStep& m,
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

}  // namespace strata::gpt::testing
