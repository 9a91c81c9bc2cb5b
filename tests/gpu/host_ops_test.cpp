// Every host op's backward against central finite differences in double
// precision: for a random projection R, L(inputs) = sum(out * R), so the
// analytic gradient is backward(dout = R). Sizes are small but awkward, and
// the loss is run with more rows than one row chunk and more vocabulary than
// one vocabulary chunk, so its blocking is exercised.
#include "gpu/host/ops.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <numeric>
#include <random>
#include <vector>

#include "tests/test_util.h"
#include "tests/tolerance.h"

namespace strata::gpu::host {
namespace {

using Vec = std::vector<double>;

Vec random_vec(size_t n, std::mt19937_64& rng, double scale = 1.0) {
  std::normal_distribution<double> d(0.0, scale);
  Vec v(n);
  for (double& x : v) x = d(rng);
  return v;
}

double dot(const Vec& a, const Vec& b) { return std::inner_product(a.begin(), a.end(), b.begin(), 0.0); }

// Compares analytic[i] with the central difference of f over input[i], for
// `samples` indices (all when the input is small). f must read `input`.
void check_gradient(const char* what, Vec& input, const Vec& analytic, const std::function<double()>& f,
                    std::mt19937_64& rng, size_t samples = 64) {
  ASSERT_EQ(input.size(), analytic.size());
  std::vector<size_t> idx(input.size());
  std::iota(idx.begin(), idx.end(), size_t{0});
  if (idx.size() > samples) {
    std::shuffle(idx.begin(), idx.end(), rng);
    idx.resize(samples);
  }
  double norm = 0;
  for (double g : analytic) norm += g * g;
  ASSERT_GT(norm, 0.0) << what << ": the analytic gradient is all zero";
  int bad = 0;
  for (size_t i : idx) {
    const double h = 1e-5 * std::max(1.0, std::fabs(input[i]));
    double keep = input[i];
    input[i] = keep + h;
    double up = f();
    input[i] = keep - h;
    double down = f();
    input[i] = keep;
    double numeric = (up - down) / (2 * h);
    double err = std::fabs(numeric - analytic[i]);
    if (err > 1e-6 + 1e-5 * std::fabs(numeric)) {
      if (bad++ < 3) {
        ADD_FAILURE() << what << "[" << i << "]: analytic " << analytic[i] << ", finite difference " << numeric;
      }
    }
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << idx.size() << " elements off";
}

TEST(HostOps, EmbeddingBackward) {
  std::mt19937_64 rng(strata::testing::test_seed(61));
  const int64_t B = 2, T = 5, C = 7, V = 11;
  std::vector<int32_t> tok = {1, 3, 3, 10, 0, 7, 1, 2, 9, 3};
  Vec wte = random_vec(V * C, rng), wpe = random_vec(T * C, rng), R = random_vec(B * T * C, rng), out(B * T * C);
  auto f = [&] {
    embedding_forward(out.data(), tok.data(), wte.data(), wpe.data(), B, T, C);
    return dot(out, R);
  };
  Vec dwte(V * C, 0.0), dwpe(T * C, 0.0);
  f();
  embedding_backward(dwte.data(), dwpe.data(), R.data(), tok.data(), B, T, C);
  check_gradient("dwte", wte, dwte, f, rng, 1000);
  check_gradient("dwpe", wpe, dwpe, f, rng, 1000);
}

TEST(HostOps, LayerNormBackward) {
  std::mt19937_64 rng(strata::testing::test_seed(62));
  const int64_t N = 5, C = 13;
  Vec x = random_vec(N * C, rng, 2.0), w = random_vec(C, rng), b = random_vec(C, rng), R = random_vec(N * C, rng);
  Vec out(N * C), mean(N), rstd(N);
  auto f = [&] {
    layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C);
    return dot(out, R);
  };
  f();
  Vec dx(N * C, 0.0), dw(C, 0.0), db(C, 0.0);
  layernorm_backward(dx.data(), dw.data(), db.data(), R.data(), x.data(), w.data(), mean.data(), rstd.data(), N, C);
  // (out - b) / w is the normalised row: mean 0, variance var / (var + eps) ~ 1.
  for (int64_t n = 0; n < N; ++n) {
    double m = 0, v = 0;
    for (int64_t i = 0; i < C; ++i) m += (out[n * C + i] - b[i]) / w[i] / C;
    for (int64_t i = 0; i < C; ++i) v += std::pow((out[n * C + i] - b[i]) / w[i] - m, 2) / C;
    EXPECT_NEAR(m, 0.0, 1e-10);
    EXPECT_NEAR(v, 1.0, 1e-4);
  }
  check_gradient("dx", x, dx, f, rng, 1000);
  check_gradient("dw", w, dw, f, rng);
  check_gradient("db", b, db, f, rng);
}

TEST(HostOps, MatmulBackward) {
  std::mt19937_64 rng(strata::testing::test_seed(63));
  const int64_t N = 7, IC = 9, OC = 5;
  Vec x = random_vec(N * IC, rng), w = random_vec(IC * OC, rng), bias = random_vec(OC, rng);
  Vec R = random_vec(N * OC, rng), out(N * OC);
  auto f = [&] {
    matmul_forward(out.data(), x.data(), w.data(), bias.data(), N, IC, OC);
    return dot(out, R);
  };
  f();
  // forward against a plain triple loop
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t o = 0; o < OC; ++o) {
      double s = bias[o];
      for (int64_t i = 0; i < IC; ++i) s += x[n * IC + i] * w[i * OC + o];
      ASSERT_NEAR(out[n * OC + o], s, strata::testing::kDoubleRoundoff);
    }
  }
  Vec dx(N * IC, 0.0), dw(IC * OC, 0.0), db(OC, 0.0);
  matmul_backward(dx.data(), dw.data(), db.data(), R.data(), x.data(), w.data(), N, IC, OC);
  check_gradient("dx", x, dx, f, rng, 1000);
  check_gradient("dw", w, dw, f, rng, 1000);
  check_gradient("dbias", bias, db, f, rng);
}

TEST(HostOps, AttentionForwardIsCausalAndBackwardMatches) {
  std::mt19937_64 rng(strata::testing::test_seed(64));
  const int64_t B = 2, T = 6, C = 8, NH = 2;
  Vec qkv = random_vec(B * T * 3 * C, rng), R = random_vec(B * T * C, rng), out(B * T * C), att(B * NH * T * T);
  auto f = [&] {
    attention_forward(out.data(), att.data(), qkv.data(), B, T, C, NH);
    return dot(out, R);
  };
  f();
  for (int64_t row = 0; row < B * NH * T; ++row) {
    int64_t t = row % T;
    double sum = 0;
    for (int64_t t2 = 0; t2 < T; ++t2) {
      double a = att[row * T + t2];
      if (t2 > t) {
        ASSERT_EQ(a, 0.0) << "attends to the future";
      }
      sum += a;
    }
    ASSERT_NEAR(sum, 1.0, strata::testing::kDoubleRoundoff);
  }
  Vec dqkv(qkv.size(), 0.0);
  attention_backward(dqkv.data(), R.data(), qkv.data(), att.data(), B, T, C, NH);
  check_gradient("dqkv", qkv, dqkv, f, rng, 1000);
}

// The lse-keeping attention over more rows than one row block (300 = 128 +
// 128 + 44): the same outputs and gradients as the attention that keeps the
// probabilities, lse the log of each row's softmax denominator, and its own
// backward against finite differences.
TEST(HostOps, FlashAttentionMatchesTheUnfusedOneAcrossRowBlocks) {
  std::mt19937_64 rng(strata::testing::test_seed(65));
  const int64_t B = 2, T = 2 * kAttnRows + 44, C = 8, NH = 2, hs = C / NH;
  Vec qkv = random_vec(B * T * 3 * C, rng), R = random_vec(B * T * C, rng);
  Vec ref(B * T * C), att(B * NH * T * T), out(B * T * C, -7.0), lse(B * NH * T, -7.0);
  Vec scratch(static_cast<size_t>(attention_scratch_elements(T)));
  attention_forward(ref.data(), att.data(), qkv.data(), B, T, C, NH);
  auto f = [&] {
    flash_attention_forward(out.data(), lse.data(), scratch.data(), qkv.data(), B, T, C, NH);
    return dot(out, R);
  };
  f();
  for (size_t i = 0; i < out.size(); ++i) ASSERT_NEAR(out[i], ref[i], strata::testing::kDoubleRoundoff) << i;
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < NH; ++h) {
      for (int64_t t = 0; t < T; ++t) {
        // att[t, 0] = exp(s_0 - lse), so lse = s_0 - log(att[t, 0])
        const double* q = &qkv[(b * T + t) * 3 * C + h * hs];
        const double* k0 = &qkv[b * T * 3 * C + C + h * hs];
        double s0 = 0;
        for (int64_t e = 0; e < hs; ++e) s0 += q[e] * k0[e];
        s0 /= std::sqrt(static_cast<double>(hs));
        const double expect = s0 - std::log(att[((b * NH + h) * T + t) * T]);
        ASSERT_NEAR(lse[(b * NH + h) * T + t], expect, 1e-9 * std::max(1.0, std::fabs(expect)));
      }
    }
  }
  Vec dref(qkv.size(), 0.5), dqkv(qkv.size(), 0.5);  // both accumulate onto the same start
  attention_backward(dref.data(), R.data(), qkv.data(), att.data(), B, T, C, NH);
  flash_attention_backward(dqkv.data(), scratch.data(), R.data(), out.data(), qkv.data(), lse.data(), B, T, C, NH);
  for (size_t i = 0; i < dqkv.size(); ++i) ASSERT_NEAR(dqkv[i], dref[i], 1e-10) << i;
  for (double& x : dqkv) x -= 0.5;
  check_gradient("dqkv", qkv, dqkv, f, rng, 200);
}

TEST(HostOps, GeluAndResidualBackward) {
  std::mt19937_64 rng(strata::testing::test_seed(65));
  const int64_t n = 37;
  Vec x = random_vec(n, rng, 3.0), R = random_vec(n, rng), out(n);
  auto f = [&] {
    gelu_forward(out.data(), x.data(), n);
    return dot(out, R);
  };
  f();
  EXPECT_NEAR(out[0], 0.5 * x[0] * (1 + std::tanh(std::sqrt(2 / M_PI) * (x[0] + 0.044715 * std::pow(x[0], 3)))), 1e-15);
  Vec dx(n, 0.0);
  gelu_backward(dx.data(), x.data(), R.data(), n);
  check_gradient("gelu dx", x, dx, f, rng);
  Vec a = random_vec(n, rng), b = random_vec(n, rng), sum(n);
  residual_forward(sum.data(), a.data(), b.data(), n);
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(sum[i], a[i] + b[i]);
  Vec acc(n, 1.0);
  accumulate(acc.data(), a.data(), n);
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(acc[i], 1.0 + a[i]);
}

TEST(HostOps, CrossEntropyChunkedMatchesFullLogitsAndBackward) {
  std::mt19937_64 rng(strata::testing::test_seed(66));
  // More rows than one row chunk (256) and more vocabulary than one chunk (4096).
  const int64_t N = 300, C = 6, V = kVocabChunk + 905;
  Vec x = random_vec(N * C, rng), wte = random_vec(V * C, rng, 0.5), lse(N);
  std::vector<int32_t> tgt(N);
  for (int64_t n = 0; n < N; ++n) tgt[n] = static_cast<int32_t>(rng() % V);
  tgt[0] = static_cast<int32_t>(V - 1);  // the last column of the last chunk
  auto f = [&] { return crossentropy_forward(lse.data(), x.data(), wte.data(), tgt.data(), N, C, V); };
  double loss = f();
  double want = 0;
  for (int64_t n = 0; n < N; ++n) {
    std::vector<double> logits(V);
    double m = -1e300;
    for (int64_t v = 0; v < V; ++v) {
      double s = 0;
      for (int64_t c = 0; c < C; ++c) s += x[n * C + c] * wte[v * C + c];
      logits[v] = s;
      m = std::max(m, s);
    }
    double z = 0;
    for (double l : logits) z += std::exp(l - m);
    want += (m + std::log(z) - logits[tgt[n]]) / N;
  }
  ASSERT_NEAR(loss, want, 1e-10);
  Vec dx(N * C, 0.0), dwte(V * C, 0.0);
  crossentropy_backward(dx.data(), dwte.data(), x.data(), wte.data(), tgt.data(), lse.data(), 1.0, N, C, V);
  check_gradient("dx", x, dx, f, rng, 60);
  check_gradient("dwte", wte, dwte, f, rng, 60);
}

}  // namespace
}  // namespace strata::gpu::host
