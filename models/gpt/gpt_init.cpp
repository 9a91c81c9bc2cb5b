#include "models/gpt/gpt_init.h"

#include <algorithm>
#include <cmath>
#include <random>

namespace strata::engine {

uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

void initial_master(const gpt::ChunkLayout& chunk, size_t c, uint64_t seed, int64_t layers, cpu_optim::Executor& ex,
                    float* out) {
  constexpr int64_t kBlock = int64_t{1} << 16;  // even: a block holds whole pairs
  constexpr uint64_t kGolden = 0x9e3779b97f4a7c15ull;
  constexpr float kTwoPi = 6.28318530717958647692f;
  const int64_t n = chunk.numel;
  const uint64_t chunk_seed = mix64(mix64(seed) ^ c);
  ex.parallel_for(n, kBlock, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; i += 2) {
      const uint64_t h = mix64(chunk_seed + static_cast<uint64_t>(i / 2) * kGolden);
      const float u1 = static_cast<float>((h >> 40) + 1) * 0x1p-24f;         // (0, 1]
      const float u2 = static_cast<float>((h >> 16) & 0xffffff) * 0x1p-24f;  // [0, 1)
      const float r = 0.02f * std::sqrt(-2.0f * std::log(u1));
      out[i] = r * std::cos(kTwoPi * u2);
      if (i + 1 < end) out[i + 1] = r * std::sin(kTwoPi * u2);
    }
  });
  const float residual_scale = 1.0f / std::sqrt(2.0f * static_cast<float>(layers));
  for (const gpt::TensorSlot& t : chunk.tensors) {
    const bool is_bias = t.name.size() >= 5 && t.name.compare(t.name.size() - 5, 5, ".bias") == 0;
    const bool is_ln = t.name.find("ln_") != std::string::npos;
    const bool residual = t.name.find("c_proj.weight") != std::string::npos;
    float* const first = out + t.offset;
    if (is_bias || is_ln) {
      std::fill(first, first + t.numel(), is_bias ? 0.0f : 1.0f);
    } else if (residual) {
      for (int64_t i = 0; i < t.numel(); ++i) first[i] *= residual_scale;
    }
  }
}

void synthetic_batch(uint64_t seed, int64_t vocab, int64_t batch, int64_t seq, int64_t index,
                     std::vector<int32_t>* tokens, std::vector<int32_t>* targets) {
  const int64_t n = batch * seq;
  tokens->resize(static_cast<size_t>(n));
  targets->resize(static_cast<size_t>(n));
  std::mt19937_64 rng(seed * 1000003 + static_cast<uint64_t>(index));
  const int64_t stride = 1 + static_cast<int64_t>(seed % 3);
  for (int64_t b = 0; b < batch; ++b) {
    int64_t x = static_cast<int64_t>(rng() % static_cast<uint64_t>(vocab));
    for (int64_t t = 0; t < seq; ++t) {
      (*tokens)[static_cast<size_t>(b * seq + t)] = static_cast<int32_t>(x);
      x = (x + stride) % vocab;
      (*targets)[static_cast<size_t>(b * seq + t)] = static_cast<int32_t>(x);
    }
  }
}

std::string chunk_name(const gpt::ChunkLayout& chunk) {
  switch (chunk.kind) {
    case gpt::ChunkKind::kEmbedding:
      return "embedding";
    case gpt::ChunkKind::kFinal:
      return "final";
    case gpt::ChunkKind::kBlock:
      break;
  }
  return "h." + std::to_string(chunk.block);
}

}  // namespace strata::engine
