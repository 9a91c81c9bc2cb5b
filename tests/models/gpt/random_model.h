// A GPT's parameter chunks (model_layout order) with GPT-2-like random
// values for tests: every tensor ~ N(0, scale), LayerNorm weights 1 + N(0,
// scale); chunk padding stays 0.
#pragma once

#include <random>
#include <string>
#include <vector>

#include "models/gpt/gpt_config.h"
#include "models/gpt/host/gpt.h"

namespace strata::gpt::testing {

template <class Rng>
std::vector<std::vector<float>> random_model(const GptConfig& c, Rng& rng, float scale) {
  std::normal_distribution<float> nd(0.0f, scale);
  std::vector<std::vector<float>> chunks;
  for (const ChunkLayout& l : model_layout(c)) {
    std::vector<float> v(static_cast<size_t>(l.numel), 0.0f);
    for (const TensorSlot& t : l.tensors) {
      const bool ln_weight = t.name.find("ln_") != std::string::npos && t.name.find(".weight") != std::string::npos;
      for (int64_t i = 0; i < t.numel(); ++i) v[static_cast<size_t>(t.offset + i)] = (ln_weight ? 1.0f : 0.0f) + nd(rng);
    }
    chunks.push_back(std::move(v));
  }
  return chunks;
}

// HostGpt<float>'s loss for (tokens, targets) and, in *grads (resized to
// w's chunks and zeroed first), dloss times every chunk's gradient: the
// reference a whole-model step is compared with.
inline float reference_step(const GptConfig& c, int64_t B, int64_t seq, std::vector<std::vector<float>>& w,
                            const std::vector<int32_t>& tokens, const std::vector<int32_t>& targets, float dloss,
                            std::vector<std::vector<float>>* grads) {
  grads->clear();
  for (const auto& v : w) grads->emplace_back(v.size(), 0.0f);
  host::HostGpt<float> ref(c, B, seq);
  host::ModelParams<float> pw, pg;
  for (auto& v : w) pw.chunks.push_back(v.data());
  for (auto& v : *grads) pg.chunks.push_back(v.data());
  const float loss = ref.forward(pw, tokens.data(), targets.data());
  ref.backward(pw, pg, dloss);
  return loss;
}

}  // namespace strata::gpt::testing
