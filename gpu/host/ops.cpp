// Host implementations of the transformer ops. Formulas follow GPT-2 and
// llm.c's train_gpt2.c (layernorm, attention, GELU backward derivations);
// the tests check every backward against central finite differences in
// double precision. Loops run on oneTBB with every output element owned by
// one task and summed in a fixed order, so results do not depend on the
// thread count; GEMMs run on OpenBLAS's threads.
#include "gpu/host/ops.h"

#include "common/dtype.h"

#ifdef STRATA_HAVE_OPENBLAS
#include <cblas.h>
#endif

#ifdef STRATA_HAVE_TBB
#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>
#endif

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <memory>
#include <thread>
#include <vector>

namespace strata::gpu::host {
namespace {

// Row-major C[M,N] = alpha * op(A)[M,K] @ op(B)[K,N] + beta * C.
#ifdef STRATA_HAVE_OPENBLAS
void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda, const float* B,
          int64_t ldb, float beta, float* C, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, static_cast<int>(M),
              static_cast<int>(N), static_cast<int>(K), alpha, A, static_cast<int>(lda), B, static_cast<int>(ldb), beta,
              C, static_cast<int>(ldc));
}

void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, double alpha, const double* A, int64_t lda,
          const double* B, int64_t ldb, double beta, double* C, int64_t ldc) {
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, static_cast<int>(M),
              static_cast<int>(N), static_cast<int>(K), alpha, A, static_cast<int>(lda), B, static_cast<int>(ldb), beta,
              C, static_cast<int>(ldc));
}
#else
// Only in a GPU-check build, where no BLAS is installed: plain loops.
template <class T>
void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, T alpha, const T* A, int64_t lda, const T* B, int64_t ldb,
          T beta, T* C, int64_t ldc) {
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t n = 0; n < N; ++n) {
      T s = 0;
      for (int64_t k = 0; k < K; ++k)
        s += (ta ? A[k * lda + m] : A[m * lda + k]) * (tb ? B[n * ldb + k] : B[k * ldb + n]);
      C[m * ldc + n] = alpha * s + (beta == T(0) ? T(0) : beta * C[m * ldc + n]);
    }
  }
}
#endif

constexpr int64_t kRowChunk = 256;  // rows of logits produced at once by the loss

// fn(begin, end) over [0, n) in chunks of `grain`, in parallel.
// (Serial in a GPU-check build without oneTBB; the results are the same.)
int g_threads = 0;
#ifdef STRATA_HAVE_TBB
std::unique_ptr<tbb::task_arena> g_arena;  // when the threads are capped
#endif

template <class F>
void parallel(int64_t n, int64_t grain, const F& fn) {
  if (n <= 0) return;
#ifdef STRATA_HAVE_TBB
  auto body = [&] {
    tbb::parallel_for(tbb::blocked_range<int64_t>(0, n, std::max<int64_t>(grain, 1)),
                      [&](const tbb::blocked_range<int64_t>& r) { fn(r.begin(), r.end()); });
  };
  if (g_arena) {
    g_arena->execute(body);
  } else {
    body();
  }
#else
  (void)grain;
  fn(0, n);
#endif
}

// One element of bf16 / fp16 storage to fp32 and back (round to nearest even).
float widen(uint16_t h, DType dtype) { return dtype == DType::kBF16 ? bf16_to_f32(h) : f16_to_f32(h); }
uint16_t narrow(float x, DType dtype) { return dtype == DType::kBF16 ? f32_to_bf16(x) : f32_to_f16(x); }

}  // namespace

void set_compute_threads(int threads) {
  const int before = g_threads;
  g_threads = threads > 0 ? threads : 0;
#ifdef STRATA_HAVE_OPENBLAS
  if (g_threads > 0) {
    openblas_set_num_threads(g_threads);
  } else if (before > 0) {
    openblas_set_num_threads(static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
  }
#else
  (void)before;
#endif
#ifdef STRATA_HAVE_TBB
  g_arena = g_threads > 0 ? std::make_unique<tbb::task_arena>(g_threads) : nullptr;
#endif
}

int compute_threads() { return g_threads; }

template <class T>
void embedding_forward(T* out, const int32_t* tokens, const T* wte, const T* wpe, int64_t B, int64_t seq, int64_t C) {
  parallel(B * seq, 64, [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n) {
      T* o = out + n * C;
      const T* te = wte + static_cast<int64_t>(tokens[n]) * C;
      const T* pe = wpe + (n % seq) * C;
      for (int64_t i = 0; i < C; ++i) o[i] = te[i] + pe[i];
    }
  });
}

template <class T>
void embedding_backward(T* dwte, T* dwpe, const T* dout, const int32_t* tokens, int64_t B, int64_t seq, int64_t C) {
  // Tokens repeat, so rows cannot be split: split the channels instead and
  // walk the rows in order within each.
  parallel(C, 16, [&](int64_t c0, int64_t c1) {
    for (int64_t n = 0; n < B * seq; ++n) {
      const T* d = dout + n * C;
      T* te = dwte + static_cast<int64_t>(tokens[n]) * C;
      T* pe = dwpe + (n % seq) * C;
      for (int64_t i = c0; i < c1; ++i) {
        te[i] += d[i];
        pe[i] += d[i];
      }
    }
  });
}

template <class T>
void layernorm_forward(T* out, T* mean, T* rstd, const T* x, const T* w, const T* b, int64_t N, int64_t C) {
  const T eps = T(1e-5);
  parallel(N, 16, [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n) {
      const T* xr = x + n * C;
      T m = 0;
      for (int64_t i = 0; i < C; ++i) m += xr[i];
      m /= static_cast<T>(C);
      T v = 0;
      for (int64_t i = 0; i < C; ++i) v += (xr[i] - m) * (xr[i] - m);
      v /= static_cast<T>(C);
      T s = T(1) / std::sqrt(v + eps);
      T* o = out + n * C;
      for (int64_t i = 0; i < C; ++i) o[i] = (xr[i] - m) * s * w[i] + b[i];
      mean[n] = m;
      rstd[n] = s;
    }
  });
}

template <class T>
void layernorm_backward(T* dx, T* dw, T* db, const T* dout, const T* x, const T* w, const T* mean, const T* rstd,
                        int64_t N, int64_t C) {
  parallel(N, 16, [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n) {
      const T* d = dout + n * C;
      const T* xr = x + n * C;
      T* dxr = dx + n * C;
      T dnorm_mean = 0, dnorm_norm_mean = 0;
      for (int64_t i = 0; i < C; ++i) {
        T norm = (xr[i] - mean[n]) * rstd[n];
        T dnorm = w[i] * d[i];
        dnorm_mean += dnorm;
        dnorm_norm_mean += dnorm * norm;
      }
      dnorm_mean /= static_cast<T>(C);
      dnorm_norm_mean /= static_cast<T>(C);
      for (int64_t i = 0; i < C; ++i) {
        T norm = (xr[i] - mean[n]) * rstd[n];
        dxr[i] += (w[i] * d[i] - dnorm_mean - norm * dnorm_norm_mean) * rstd[n];
      }
    }
  });
  // dw, db: each channel sums over the rows in order.
  parallel(C, 16, [&](int64_t c0, int64_t c1) {
    for (int64_t n = 0; n < N; ++n) {
      const T* d = dout + n * C;
      const T* xr = x + n * C;
      for (int64_t i = c0; i < c1; ++i) {
        db[i] += d[i];
        dw[i] += (xr[i] - mean[n]) * rstd[n] * d[i];
      }
    }
  });
}

template <class T>
void matmul_forward(T* out, const T* x, const T* w, const T* bias, int64_t N, int64_t IC, int64_t OC) {
  gemm(false, false, N, OC, IC, T(1), x, IC, w, OC, T(0), out, OC);
  if (bias == nullptr) return;
  parallel(N, 16, [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n) {
      for (int64_t o = 0; o < OC; ++o) out[n * OC + o] += bias[o];
    }
  });
}

template <class T>
void matmul_backward(T* dx, T* dw, T* dbias, const T* dout, const T* x, const T* w, int64_t N, int64_t IC, int64_t OC) {
  gemm(false, true, N, IC, OC, T(1), dout, OC, w, OC, T(1), dx, IC);
  gemm(true, false, IC, OC, N, T(1), x, IC, dout, OC, T(1), dw, OC);
  if (dbias == nullptr) return;
  parallel(OC, 64, [&](int64_t o0, int64_t o1) {
    for (int64_t n = 0; n < N; ++n) {
      for (int64_t o = o0; o < o1; ++o) dbias[o] += dout[n * OC + o];
    }
  });
}

// Attention per (sequence, head) as GEMMs on strided views of qkv (rows of
// 3C): scores = scale * Q K^T over the full T x T (the masked half is then
// zeroed), row softmax, out = P V. Backward: dP = dout V^T, dV += P^T dout,
// dS = P * (dP - rowsum(P * dP)), dQ += scale * dS K, dK += scale * dS^T Q.
namespace {
// One (sequence b, head h)'s q, k and v slices of a [B,T,3C] tensor (row
// stride 3C), for the attention's per-head GEMMs; T is const for inputs.
template <class T>
struct HeadQkv {
  T *q, *k, *v;
  HeadQkv(T* qkv, int64_t b, int64_t h, int64_t seq, int64_t C, int64_t hs)
      : q(qkv + b * seq * 3 * C + h * hs), k(q + C), v(q + 2 * C) {}
};

// Softmax in place over a [rows, cols] block of attention scores whose row r
// is query `first + r`: columns 0..first + r, zero beyond (causal); with
// `lse`, lse[first + r] = the row's log-sum-exp.
template <class T>
void causal_softmax_rows(T* scores, int64_t rows, int64_t cols, int64_t first, T* lse) {
  parallel(rows, 16, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t t = first + r;
      T* row = scores + r * cols;
      T maxval = -std::numeric_limits<T>::infinity();
      for (int64_t t2 = 0; t2 <= t; ++t2) maxval = std::max(maxval, row[t2]);
      T sum = 0;
      for (int64_t t2 = 0; t2 <= t; ++t2) {
        row[t2] = std::exp(row[t2] - maxval);
        sum += row[t2];
      }
      for (int64_t t2 = 0; t2 < cols; ++t2) row[t2] = t2 <= t ? row[t2] / sum : T(0);
      if (lse != nullptr) lse[t] = maxval + std::log(sum);
    }
  });
}
}  // namespace

template <class T>
void attention_forward(T* out, T* att, const T* qkv, int64_t B, int64_t seq, int64_t C, int64_t NH) {
  const int64_t hs = C / NH, ld = 3 * C;
  const T scale = T(1) / std::sqrt(static_cast<T>(hs));
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < NH; ++h) {
      const auto [q, k, v] = HeadQkv<const T>(qkv, b, h, seq, C, hs);
      T* a = att + (b * NH + h) * seq * seq;
      gemm(false, true, seq, seq, hs, scale, q, ld, k, ld, T(0), a, seq);
      causal_softmax_rows(a, seq, seq, 0, static_cast<T*>(nullptr));
      gemm(false, false, seq, hs, seq, T(1), a, seq, v, ld, T(0), out + b * seq * C + h * hs, C);
    }
  }
}

template <class T>
void attention_backward(T* dqkv, const T* dout, const T* qkv, const T* att, int64_t B, int64_t seq, int64_t C,
                        int64_t NH) {
  const int64_t hs = C / NH, ld = 3 * C;
  const T scale = T(1) / std::sqrt(static_cast<T>(hs));
  std::vector<T> ds(static_cast<size_t>(seq * seq));
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < NH; ++h) {
      const auto [q, k, v] = HeadQkv<const T>(qkv, b, h, seq, C, hs);
      const auto [dq, dk, dv] = HeadQkv<T>(dqkv, b, h, seq, C, hs);
      const T* a = att + (b * NH + h) * seq * seq;
      const T* d = dout + b * seq * C + h * hs;
      gemm(false, true, seq, seq, hs, T(1), d, C, v, ld, T(0), ds.data(), seq);  // dP
      gemm(true, false, seq, hs, seq, T(1), a, seq, d, C, T(1), dv, ld);
      parallel(seq, 16, [&](int64_t t0, int64_t t1) {
        for (int64_t t = t0; t < t1; ++t) {
          const T* p = a + t * seq;
          T* row = ds.data() + t * seq;
          T dot = 0;
          for (int64_t t2 = 0; t2 <= t; ++t2) dot += p[t2] * row[t2];
          for (int64_t t2 = 0; t2 < seq; ++t2) row[t2] = t2 <= t ? p[t2] * (row[t2] - dot) : T(0);
        }
      });
      gemm(false, false, seq, hs, seq, scale, ds.data(), seq, k, ld, T(1), dq, ld);
      gemm(true, false, seq, hs, seq, scale, ds.data(), seq, q, ld, T(1), dk, ld);
    }
  }
}

template <class T>
void flash_attention_forward(T* out, T* lse, T* scratch, const T* qkv, int64_t B, int64_t seq, int64_t C, int64_t NH) {
  const int64_t hs = C / NH, ld = 3 * C;
  const T scale = T(1) / std::sqrt(static_cast<T>(hs));
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < NH; ++h) {
      const auto [q, k, v] = HeadQkv<const T>(qkv, b, h, seq, C, hs);
      T* l = lse + (b * NH + h) * seq;
      for (int64_t q0 = 0; q0 < seq; q0 += kAttnRows) {
        // rows [q0, q1) see keys [0, q1): a rows x q1 block of scores
        const int64_t q1 = std::min(seq, q0 + kAttnRows), rows = q1 - q0;
        gemm(false, true, rows, q1, hs, scale, q + q0 * ld, ld, k, ld, T(0), scratch, q1);
        causal_softmax_rows(scratch, rows, q1, q0, l);
        gemm(false, false, rows, hs, q1, T(1), scratch, q1, v, ld, T(0), out + (b * seq + q0) * C + h * hs, C);
      }
    }
  }
}

template <class T>
void flash_attention_backward(T* dqkv, T* scratch, const T* dout, const T* out, const T* qkv, const T* lse, int64_t B,
                              int64_t seq, int64_t C, int64_t NH) {
  const int64_t hs = C / NH, ld = 3 * C;
  const T scale = T(1) / std::sqrt(static_cast<T>(hs));
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < NH; ++h) {
      const auto [q, k, v] = HeadQkv<const T>(qkv, b, h, seq, C, hs);
      const auto [dq, dk, dv] = HeadQkv<T>(dqkv, b, h, seq, C, hs);
      const T* l = lse + (b * NH + h) * seq;
      const T* d = dout + b * seq * C + h * hs;
      const T* o = out + b * seq * C + h * hs;
      for (int64_t q0 = 0; q0 < seq; q0 += kAttnRows) {
        const int64_t q1 = std::min(seq, q0 + kAttnRows), rows = q1 - q0;
        T* p = scratch;               // [rows, q1] probabilities, recomputed
        T* ds = scratch + rows * q1;  // [rows, q1] dP, then dS
        gemm(false, true, rows, q1, hs, scale, q + q0 * ld, ld, k, ld, T(0), p, q1);
        gemm(false, true, rows, q1, hs, T(1), d + q0 * C, C, v, ld, T(0), ds, q1);
        parallel(rows, 16, [&](int64_t r0, int64_t r1) {
          for (int64_t r = r0; r < r1; ++r) {
            const int64_t t = q0 + r;
            // sum_j P[t,j] dP[t,j] = dout[t] . out[t]
            T dot = 0;
            for (int64_t e = 0; e < hs; ++e) dot += d[t * C + e] * o[t * C + e];
            T* prow = p + r * q1;
            T* srow = ds + r * q1;
            for (int64_t t2 = 0; t2 < q1; ++t2) {
              prow[t2] = t2 <= t ? std::exp(prow[t2] - l[t]) : T(0);
              srow[t2] = prow[t2] * (srow[t2] - dot);
            }
          }
        });
        gemm(true, false, q1, hs, rows, T(1), p, q1, d + q0 * C, C, T(1), dv, ld);
        gemm(false, false, rows, hs, q1, scale, ds, q1, k, ld, T(1), dq + q0 * ld, ld);
        gemm(true, false, q1, hs, rows, scale, ds, q1, q + q0 * ld, ld, T(1), dk, ld);
      }
    }
  }
}

namespace {
template <class T>
constexpr T kGeluScale = static_cast<T>(0.79788456080286535587989211986876);  // sqrt(2/pi)

// tanh in fp32 without a libm call, so the GELU loops vectorise (libm's
// tanhf was a fifth of the host backend's step): tanh(u) = (e - 1) / (e + 1)
// with e = exp(2u), 2u clamped to [-40, 40] (tanh is +-1 in fp32 well
// before), exp by n = round(x / ln 2), a two-part ln 2 and a degree-7
// Taylor polynomial on |r| <= ln2 / 2 (truncation ~3e-9 relative), scaled
// by 2^n through the exponent bits. Absolute error within ~2e-7 of tanh:
// GELU uses 1 + tanh and 1 - tanh^2, where that is an fp32 rounding or
// two. The double instantiation (the tests' reference) keeps std::tanh.
inline float gelu_tanh(float u) {
  const float x = std::min(std::max(2.0f * u, -40.0f), 40.0f);
  const float t = x * 1.44269504088896341f;  // x / ln 2
  const int n = static_cast<int>(t + std::copysign(0.5f, t));
  const float fn = static_cast<float>(n);
  const float r = (x - fn * 0.693145751953125f) - fn * 1.42860682030941723212e-6f;  // ln 2 = hi + lo
  float p = 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const float e = p * std::bit_cast<float>(static_cast<uint32_t>(n + 127) << 23);
  return (e - 1.0f) / (e + 1.0f);
}
inline double gelu_tanh(double u) { return std::tanh(u); }
}  // namespace

template <class T>
void gelu_forward(T* out, const T* x, int64_t n) {
  parallel(n, 4096, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      T v = x[i];
      out[i] = T(0.5) * v * (T(1) + gelu_tanh(kGeluScale<T> * (v + T(0.044715) * v * v * v)));
    }
  });
}

template <class T>
void gelu_backward(T* dx, const T* x, const T* dout, int64_t n) {
  parallel(n, 4096, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      T v = x[i];
      T u = kGeluScale<T> * (v + T(0.044715) * v * v * v);
      T th = gelu_tanh(u);
      T sech2 = T(1) - th * th;
      T local = T(0.5) * (T(1) + th) + v * T(0.5) * sech2 * kGeluScale<T> * (T(1) + T(3) * T(0.044715) * v * v);
      dx[i] += local * dout[i];
    }
  });
}

template <class T>
void residual_forward(T* out, const T* a, const T* b, int64_t n) {
  parallel(n, 1 << 14, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) out[i] = a[i] + b[i];
  });
}

template <class T>
void accumulate(T* dst, const T* src, int64_t n) {
  parallel(n, 1 << 14, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) dst[i] += src[i];
  });
}

namespace {

// The loss reads the tied embedding kVocabChunk rows at a time: straight
// from an array of T, or widened from bf16/fp16 storage into a scratch.
template <class T>
struct DirectRows {
  const T* wte;
  int64_t C;
  const T* rows(int64_t v0, int64_t) { return wte + v0 * C; }
};

struct WidenedRows {
  const uint16_t* wte;
  DType dtype;
  int64_t C;
  std::vector<float> buf;
  const float* rows(int64_t v0, int64_t cols) {
    buf.resize(static_cast<size_t>(cols * C));
    host::widen(wte + v0 * C, dtype, buf.data(), cols * C);
    return buf.data();
  }
};

template <class T, class Rows>
T crossentropy_forward_impl(T* lse, const T* x, Rows& wte, const int32_t* targets, int64_t N, int64_t C, int64_t V) {
  std::vector<T> logits(static_cast<size_t>(kRowChunk * std::min(kVocabChunk, V)));
  std::vector<T> run_max(static_cast<size_t>(kRowChunk)), run_sum(static_cast<size_t>(kRowChunk));
  std::vector<T> target_logit(static_cast<size_t>(kRowChunk));
  T total = 0;
  for (int64_t r0 = 0; r0 < N; r0 += kRowChunk) {
    const int64_t rows = std::min(kRowChunk, N - r0);
    std::fill(run_max.begin(), run_max.end(), -std::numeric_limits<T>::infinity());
    std::fill(run_sum.begin(), run_sum.end(), T(0));
    for (int64_t v0 = 0; v0 < V; v0 += kVocabChunk) {
      const int64_t cols = std::min(kVocabChunk, V - v0);
      gemm(false, true, rows, cols, C, T(1), x + r0 * C, C, wte.rows(v0, cols), C, T(0), logits.data(), cols);
      for (int64_t r = 0; r < rows; ++r) {
        const T* l = logits.data() + r * cols;
        T m = run_max[r];
        for (int64_t j = 0; j < cols; ++j) m = std::max(m, l[j]);
        // online log-sum-exp: rescale the running sum to the new maximum
        T s = run_sum[r] * std::exp(run_max[r] - m);
        for (int64_t j = 0; j < cols; ++j) s += std::exp(l[j] - m);
        run_max[r] = m;
        run_sum[r] = s;
        int64_t tgt = targets[r0 + r];
        if (tgt >= v0 && tgt < v0 + cols) target_logit[r] = l[tgt - v0];
      }
    }
    for (int64_t r = 0; r < rows; ++r) {
      lse[r0 + r] = run_max[r] + std::log(run_sum[r]);
      total += lse[r0 + r] - target_logit[r];
    }
  }
  return total / static_cast<T>(N);
}

// dwte_rows(v0, cols, dl, x_rows, rows) adds dl^T @ x_rows into the
// embedding's rows [v0, v0 + cols), however they are stored.
template <class T, class Rows, class DwteRows>
void crossentropy_backward_impl(T* dx, const DwteRows& dwte_rows, const T* x, Rows& wte, const int32_t* targets,
                                const T* lse, T dloss, int64_t N, int64_t C, int64_t V) {
  std::vector<T> dlogits(static_cast<size_t>(kRowChunk * std::min(kVocabChunk, V)));
  const T k = dloss / static_cast<T>(N);
  for (int64_t r0 = 0; r0 < N; r0 += kRowChunk) {
    const int64_t rows = std::min(kRowChunk, N - r0);
    for (int64_t v0 = 0; v0 < V; v0 += kVocabChunk) {
      const int64_t cols = std::min(kVocabChunk, V - v0);
      T* dl = dlogits.data();
      const T* w = wte.rows(v0, cols);
      gemm(false, true, rows, cols, C, T(1), x + r0 * C, C, w, C, T(0), dl, cols);
      // d loss / d logit = (softmax - onehot(target)) / N
      for (int64_t r = 0; r < rows; ++r) {
        T* l = dl + r * cols;
        for (int64_t j = 0; j < cols; ++j) l[j] = std::exp(l[j] - lse[r0 + r]) * k;
        int64_t tgt = targets[r0 + r];
        if (tgt >= v0 && tgt < v0 + cols) l[tgt - v0] -= k;
      }
      gemm(false, false, rows, C, cols, T(1), dl, cols, w, C, T(1), dx + r0 * C, C);
      dwte_rows(v0, cols, dl, x + r0 * C, rows);
    }
  }
}

}  // namespace

template <class T>
T crossentropy_forward(T* lse, const T* x, const T* wte, const int32_t* targets, int64_t N, int64_t C, int64_t V) {
  DirectRows<T> rows{wte, C};
  return crossentropy_forward_impl(lse, x, rows, targets, N, C, V);
}

template <class T>
void crossentropy_backward(T* dx, T* dwte, const T* x, const T* wte, const int32_t* targets, const T* lse, T dloss,
                           int64_t N, int64_t C, int64_t V) {
  DirectRows<T> rows{wte, C};
  auto dwte_rows = [&](int64_t v0, int64_t cols, const T* dl, const T* xr, int64_t rows_n) {
    gemm(true, false, cols, C, rows_n, T(1), dl, cols, xr, C, T(1), dwte + v0 * C, C);
  };
  crossentropy_backward_impl(dx, dwte_rows, x, rows, targets, lse, dloss, N, C, V);
}

float crossentropy_forward_lp(float* lse, const float* x, const uint16_t* wte, DType wte_dtype,
                              const int32_t* targets, int64_t N, int64_t C, int64_t V) {
  WidenedRows rows{wte, wte_dtype, C, {}};
  return crossentropy_forward_impl(lse, x, rows, targets, N, C, V);
}

void crossentropy_backward_lp(float* dx, uint16_t* dwte, DType wte_dtype, const float* x, const uint16_t* wte,
                              const int32_t* targets, const float* lse, float dloss, int64_t N, int64_t C,
                              int64_t V) {
  WidenedRows rows{wte, wte_dtype, C, {}};
  std::vector<float> d(static_cast<size_t>(std::min(kVocabChunk, V) * C));
  auto dwte_rows = [&](int64_t v0, int64_t cols, const float* dl, const float* xr, int64_t rows_n) {
    gemm(true, false, cols, C, rows_n, 1.0f, dl, cols, xr, C, 0.0f, d.data(), C);
    add_rounded(dwte + v0 * C, wte_dtype, d.data(), cols * C);
  };
  crossentropy_backward_impl(dx, dwte_rows, x, rows, targets, lse, dloss, N, C, V);
}

void widen(const uint16_t* src, DType dtype, float* dst, int64_t n) {
  parallel(n, 1 << 14, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) dst[i] = widen(src[i], dtype);
  });
}

void narrow(const float* src, uint16_t* dst, DType dtype, int64_t n) {
  parallel(n, 1 << 14, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) dst[i] = narrow(src[i], dtype);
  });
}

void add_rounded(uint16_t* dst, DType dtype, const float* src, int64_t n) {
  parallel(n, 1 << 14, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) dst[i] = narrow(widen(dst[i], dtype) + src[i], dtype);
  });
}

#define STRATA_HOST_OPS_INSTANTIATE(T)                                                                                 \
  template void embedding_forward<T>(T*, const int32_t*, const T*, const T*, int64_t, int64_t, int64_t);               \
  template void embedding_backward<T>(T*, T*, const T*, const int32_t*, int64_t, int64_t, int64_t);                    \
  template void layernorm_forward<T>(T*, T*, T*, const T*, const T*, const T*, int64_t, int64_t);                      \
  template void layernorm_backward<T>(T*, T*, T*, const T*, const T*, const T*, const T*, const T*, int64_t, int64_t); \
  template void matmul_forward<T>(T*, const T*, const T*, const T*, int64_t, int64_t, int64_t);                        \
  template void matmul_backward<T>(T*, T*, T*, const T*, const T*, const T*, int64_t, int64_t, int64_t);               \
  template void attention_forward<T>(T*, T*, const T*, int64_t, int64_t, int64_t, int64_t);                            \
  template void attention_backward<T>(T*, const T*, const T*, const T*, int64_t, int64_t, int64_t, int64_t);           \
  template void flash_attention_forward<T>(T*, T*, T*, const T*, int64_t, int64_t, int64_t, int64_t);                  \
  template void flash_attention_backward<T>(T*, T*, const T*, const T*, const T*, const T*, int64_t, int64_t, int64_t, \
                                            int64_t);                                                                  \
  template void gelu_forward<T>(T*, const T*, int64_t);                                                                \
  template void gelu_backward<T>(T*, const T*, const T*, int64_t);                                                     \
  template void residual_forward<T>(T*, const T*, const T*, int64_t);                                                  \
  template void accumulate<T>(T*, const T*, int64_t);                                                                  \
  template T crossentropy_forward<T>(T*, const T*, const T*, const int32_t*, int64_t, int64_t, int64_t);               \
  template void crossentropy_backward<T>(T*, T*, const T*, const T*, const int32_t*, const T*, T, int64_t, int64_t,    \
                                         int64_t);

STRATA_HOST_OPS_INSTANTIATE(float)
STRATA_HOST_OPS_INSTANTIATE(double)

}  // namespace strata::gpu::host
