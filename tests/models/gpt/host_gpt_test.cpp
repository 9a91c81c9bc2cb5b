// A whole small GPT on the host: every parameter's gradient against central
// finite differences of the loss, in double precision; and the fp32 model
// against the double one.
#include "models/gpt/host/gpt.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "tests/test_util.h"
#include "tests/tolerance.h"

namespace strata::gpt::host {
namespace {

GptConfig tiny() {
  GptConfig c;
  c.layers = 2, c.hidden = 8, c.heads = 2, c.vocab = 11, c.max_seq = 5;
  return c;
}

// Chunks in model_layout order, initialised like GPT-2 (weights ~N(0, 0.2),
// LayerNorm weights 1 + noise); padding stays 0.
std::vector<std::vector<double>> init_params(const GptConfig& c, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> n(0.0, 0.2);
  std::vector<std::vector<double>> chunks;
  for (const ChunkLayout& l : model_layout(c)) {
    std::vector<double> v(static_cast<size_t>(l.numel), 0.0);
    for (const TensorSlot& t : l.tensors) {
      bool ln_weight = t.name.find("ln_") != std::string::npos && t.name.find(".weight") != std::string::npos;
      for (int64_t i = 0; i < t.numel(); ++i) v[static_cast<size_t>(t.offset + i)] = (ln_weight ? 1.0 : 0.0) + n(rng);
    }
    chunks.push_back(std::move(v));
  }
  return chunks;
}

template <class T>
ModelParams<T> view(std::vector<std::vector<T>>& chunks) {
  ModelParams<T> p;
  for (auto& c : chunks) p.chunks.push_back(c.data());
  return p;
}

const std::vector<int32_t> kTokens = {1, 5, 9, 2, 10, 0, 3, 3};
const std::vector<int32_t> kTargets = {5, 9, 2, 7, 0, 3, 3, 8};

TEST(HostGpt, EveryParameterGradientMatchesFiniteDifferences) {
  const uint64_t seed = strata::testing::test_seed(71);
  GptConfig c = tiny();
  const int64_t B = 2, T = 4;
  auto params = init_params(c, seed);
  std::vector<std::vector<double>> grads;
  for (auto& p : params) grads.emplace_back(p.size(), 0.0);
  HostGpt<double> model(c, B, T);
  double loss = model.forward(view(params), kTokens.data(), kTargets.data());
  EXPECT_GT(loss, 0.5 * std::log(11.0));  // an untrained model is near uniform
  model.backward(view(params), view(grads));
  std::vector<ChunkLayout> layout = model_layout(c);
  int checked = 0, bad = 0;
  for (size_t k = 0; k < layout.size(); ++k) {
    for (const TensorSlot& t : layout[k].tensors) {
      for (int64_t i = 0; i < t.numel(); ++i) {
        double& w = params[k][static_cast<size_t>(t.offset + i)];
        const double h = 1e-5, keep = w;
        w = keep + h;
        double up = model.forward(view(params), kTokens.data(), kTargets.data());
        w = keep - h;
        double down = model.forward(view(params), kTokens.data(), kTargets.data());
        w = keep;
        double numeric = (up - down) / (2 * h), analytic = grads[k][static_cast<size_t>(t.offset + i)];
        ++checked;
        if (std::fabs(numeric - analytic) > 1e-7 + 1e-5 * std::fabs(numeric) && bad++ < 5) {
          ADD_FAILURE() << t.name << "[" << i << "]: analytic " << analytic << ", finite difference " << numeric;
        }
      }
    }
  }
  EXPECT_EQ(bad, 0);
  EXPECT_EQ(checked, parameter_count(c));
  // Padding between tensors gets no gradient.
  for (size_t k = 0; k < layout.size(); ++k) {
    int64_t end = 0;
    for (const TensorSlot& t : layout[k].tensors) {
      for (int64_t i = end; i < t.offset; ++i) ASSERT_EQ(grads[k][static_cast<size_t>(i)], 0.0);
      end = t.offset + t.numel();
    }
  }
}

TEST(HostGpt, Fp32MatchesDoubleReference) {
  const uint64_t seed = strata::testing::test_seed(72);
  GptConfig c = tiny();
  const int64_t B = 2, T = 4;
  auto p64 = init_params(c, seed);
  std::vector<std::vector<float>> p32;
  for (auto& v : p64) p32.emplace_back(v.begin(), v.end());
  std::vector<std::vector<double>> g64;
  std::vector<std::vector<float>> g32;
  for (auto& v : p64) g64.emplace_back(v.size(), 0.0), g32.emplace_back(v.size(), 0.0f);
  HostGpt<double> m64(c, B, T);
  HostGpt<float> m32(c, B, T);
  double l64 = m64.forward(view(p64), kTokens.data(), kTargets.data());
  double l32 = m32.forward(view(p32), kTokens.data(), kTargets.data());
  EXPECT_NEAR(l32, l64, strata::testing::kF32ModelRel * l64);
  m64.backward(view(p64), view(g64));
  m32.backward(view(p32), view(g32));
  double diff = 0, norm = 0;
  for (size_t k = 0; k < g64.size(); ++k) {
    for (size_t i = 0; i < g64[k].size(); ++i) {
      diff += std::pow(g32[k][i] - g64[k][i], 2);
      norm += g64[k][i] * g64[k][i];
    }
  }
  ASSERT_GT(norm, 0.0);
  EXPECT_LT(std::sqrt(diff / norm), 1e-5);
}

}  // namespace
}  // namespace strata::gpt::host

#ifdef STRATA_TEST_HAVE_TBB
#include <tbb/global_control.h>

namespace strata::gpt::host {
namespace {

// The host loops split work so that each output element is produced by one
// task in a fixed order: one thread and all threads give the same bits.
TEST(HostGpt, BitIdenticalAcrossThreadCounts) {
  GptConfig c;
  c.layers = 2, c.hidden = 64, c.heads = 4, c.vocab = 300, c.max_seq = 32;
  const int64_t B = 3, T = 32;
  std::vector<std::vector<float>> p;
  for (auto& v : init_params(c, 9)) p.emplace_back(v.begin(), v.end());
  std::vector<int32_t> tok(B * T), tgt(B * T);
  for (int64_t i = 0; i < B * T; ++i) tok[i] = static_cast<int32_t>((i * 7) % 300), tgt[i] = static_cast<int32_t>((i * 13) % 300);
  auto run = [&](int threads) {
    tbb::global_control limit(tbb::global_control::max_allowed_parallelism, static_cast<size_t>(threads));
    std::vector<std::vector<float>> g;
    for (auto& v : p) g.emplace_back(v.size(), 0.0f);
    HostGpt<float> m(c, B, T);
    float loss = m.forward(view(p), tok.data(), tgt.data());
    m.backward(view(p), view(g));
    g.push_back({loss});
    return g;
  };
  EXPECT_EQ(run(1), run(4));
}

}  // namespace
}  // namespace strata::gpt::host
#endif
