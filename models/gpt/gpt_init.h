// The built-in GPT's initial weights, its synthetic data and its chunks'
// names: what its trainer and its session client share, so both start
// from the same bits and see the same batches.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cpu_optim/executor.h"
#include "models/gpt/gpt_config.h"

namespace strata::engine {

// splitmix64's finaliser: well-spread generator seeds from small integers
// (the initial weights' draws; the arithmetic data's too).
uint64_t mix64(uint64_t x);

// Chunk c's (of a model of `layers` blocks) initial fp32 master weights
// into out[0, numel), GPT-2's initialisation: weights ~ N(0, 0.02), the residual projections
// (attn.c_proj, mlp.c_proj) scaled by 1/sqrt(2L), LayerNorm weights 1,
// biases 0. Elements 2k and 2k+1 are a Box-Muller pair made of the k-th
// output of splitmix64 started at a seed of (seed, c): 24 bits for the
// radius, 24 for the angle (so |z| <= 5.77). Each draw is a function of its
// index alone: the same weights at any thread count, and — unlike
// std::normal_distribution, whose algorithm is each standard library's own
// — the same with any C++ library over the same libm. The executor's
// threads draw them (and fault the pages in): a 10B model's 10^10 draws
// spread over the cores.
void initial_master(const gpt::ChunkLayout& chunk, size_t c, uint64_t seed, int64_t layers, cpu_optim::Executor& ex,
                    float* out);

// Micro-batch `index` of the synthetic stream (batch x seq tokens and as
// many targets, row-major): each row starts at a draw of a generator seeded
// by (seed, index) and steps by 1 + seed % 3 modulo the vocabulary; the
// target of a token is the next one. A function of the index alone.
void synthetic_batch(uint64_t seed, int64_t vocab, int64_t batch, int64_t seq, int64_t index,
                     std::vector<int32_t>* tokens, std::vector<int32_t>* targets);

// "embedding", "h.<layer>" or "final": the chunk's name in a session.
std::string chunk_name(const gpt::ChunkLayout& chunk);

}  // namespace strata::engine
