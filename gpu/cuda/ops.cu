// CUDA kernels of the transformer ops; formulas as gpu/host/ops.cpp. Tensors
// are fp32, bf16 or fp16 (template T; bf16/fp16 arithmetic is done in fp32:
// every load widens, every sum accumulates in fp32, every store rounds to
// nearest even once). LayerNorm statistics stay fp32. Correct first: one
// thread (or one warp) per row and ordered reductions, so every result is
// deterministic. The fused (FlashAttention-style) attention is in
// flash_attention.cu; this file's unfused one keeps the probabilities.
#include <cmath>
#include <limits>

#include "gpu/cuda/cuda_check.h"
#include "gpu/cuda/element.cuh"
#include "gpu/cuda/ops.h"

namespace strata::gpu::cuda {
namespace {

using namespace detail;

template <class T>
__global__ void embedding_forward_kernel(T* out, const int32_t* tokens, const T* wte, const T* wpe, int64_t N,
                                         int64_t seq, int64_t C) {
  int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= N * C) return;
  int64_t n = i / C, c = i % C;
  out[i] = from_f<T>(to_f(wte[static_cast<int64_t>(tokens[n]) * C + c]) + to_f(wpe[(n % seq) * C + c]));
}

// One thread per channel walks the rows in order: deterministic, no atomics.
template <class T>
__global__ void embedding_backward_kernel(T* dwte, T* dwpe, const T* dout, const int32_t* tokens, int64_t N,
                                          int64_t seq, int64_t C) {
  int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= C) return;
  for (int64_t n = 0; n < N; ++n) {
    float d = to_f(dout[n * C + c]);
    add_to(&dwte[static_cast<int64_t>(tokens[n]) * C + c], d);
    add_to(&dwpe[(n % seq) * C + c], d);
  }
}

// One warp per row.
template <class T>
__global__ void layernorm_forward_kernel(T* out, float* mean, float* rstd, const T* x, const T* w, const T* b,
                                         int64_t N, int64_t C) {
  int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  int lane = threadIdx.x % 32;
  if (row >= N) return;
  const T* xr = x + row * C;
  float s = 0;
  for (int64_t i = lane; i < C; i += 32) s += to_f(xr[i]);
  float m = warp_sum(s) / static_cast<float>(C);
  float v = 0;
  for (int64_t i = lane; i < C; i += 32) v += (to_f(xr[i]) - m) * (to_f(xr[i]) - m);
  float r = rsqrtf(warp_sum(v) / static_cast<float>(C) + 1e-5f);
  for (int64_t i = lane; i < C; i += 32) {
    out[row * C + i] = from_f<T>((to_f(xr[i]) - m) * r * to_f(w[i]) + to_f(b[i]));
  }
  if (lane == 0) {
    mean[row] = m;
    rstd[row] = r;
  }
}

template <class T>
__global__ void layernorm_backward_dx_kernel(T* dx, const T* dout, const T* x, const T* w, const float* mean,
                                             const float* rstd, int64_t N, int64_t C) {
  int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  int lane = threadIdx.x % 32;
  if (row >= N) return;
  const T* d = dout + row * C;
  const T* xr = x + row * C;
  float a = 0, bsum = 0;
  for (int64_t i = lane; i < C; i += 32) {
    float norm = (to_f(xr[i]) - mean[row]) * rstd[row];
    float dnorm = to_f(w[i]) * to_f(d[i]);
    a += dnorm;
    bsum += dnorm * norm;
  }
  float dnorm_mean = warp_sum(a) / static_cast<float>(C);
  float dnorm_norm_mean = warp_sum(bsum) / static_cast<float>(C);
  for (int64_t i = lane; i < C; i += 32) {
    float norm = (to_f(xr[i]) - mean[row]) * rstd[row];
    add_to(&dx[row * C + i], (to_f(w[i]) * to_f(d[i]) - dnorm_mean - norm * dnorm_norm_mean) * rstd[row]);
  }
}

template <class T>
__global__ void layernorm_backward_dwdb_kernel(T* dw, T* db, const T* dout, const T* x, const float* mean,
                                               const float* rstd, int64_t N, int64_t C) {
  int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= C) return;
  float sw = 0, sb = 0;
  for (int64_t n = 0; n < N; ++n) {
    float d = to_f(dout[n * C + c]);
    sw += (to_f(x[n * C + c]) - mean[n]) * rstd[n] * d;
    sb += d;
  }
  add_to(&dw[c], sw);
  add_to(&db[c], sb);
}

template <class T>
__global__ void column_sum_kernel(T* dbias, const T* dout, int64_t N, int64_t OC) {
  int64_t o = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (o >= OC) return;
  float s = 0;
  for (int64_t n = 0; n < N; ++n) s += to_f(dout[n * OC + o]);
  add_to(&dbias[o], s);
}

// One thread per (b, h, t): scores over t2 <= t, softmax, weighted sum of v.
// The probabilities `att` are kept in fp32.
template <class T>
__global__ void attention_forward_kernel(T* out, float* att, const T* qkv, int64_t B, int64_t seq, int64_t C,
                                         int64_t NH) {
  int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= B * NH * seq) return;
  int64_t t = idx % seq, h = (idx / seq) % NH, b = idx / (seq * NH);
  int64_t hs = C / NH;
  float scale = rsqrtf(static_cast<float>(hs));
  const T* q = qkv + (b * seq + t) * 3 * C + h * hs;
  float* a = att + ((b * NH + h) * seq + t) * seq;
  float maxval = -INFINITY;
  for (int64_t t2 = 0; t2 <= t; ++t2) {
    const T* k = qkv + (b * seq + t2) * 3 * C + C + h * hs;
    float s = 0;
    for (int64_t i = 0; i < hs; ++i) s += to_f(q[i]) * to_f(k[i]);
    a[t2] = s * scale;
    maxval = fmaxf(maxval, a[t2]);
  }
  float sum = 0;
  for (int64_t t2 = 0; t2 <= t; ++t2) {
    a[t2] = expf(a[t2] - maxval);
    sum += a[t2];
  }
  for (int64_t t2 = 0; t2 < seq; ++t2) a[t2] = t2 <= t ? a[t2] / sum : 0.0f;
  T* o = out + (b * seq + t) * C + h * hs;
  for (int64_t i = 0; i < hs; ++i) {
    float acc = 0;
    for (int64_t t2 = 0; t2 <= t; ++t2) acc += a[t2] * to_f(qkv[(b * seq + t2) * 3 * C + 2 * C + h * hs + i]);
    o[i] = from_f<T>(acc);
  }
}

// Pass 1, one thread per (b, h, t): dpre[t, :] (fp32) and dq[t].
template <class T>
__global__ void attention_backward_q_kernel(T* dqkv, float* dpre, const T* dout, const T* qkv, const float* att,
                                            int64_t B, int64_t seq, int64_t C, int64_t NH) {
  int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= B * NH * seq) return;
  int64_t t = idx % seq, h = (idx / seq) % NH, b = idx / (seq * NH);
  int64_t hs = C / NH;
  float scale = rsqrtf(static_cast<float>(hs));
  const float* a = att + ((b * NH + h) * seq + t) * seq;
  float* dp = dpre + ((b * NH + h) * seq + t) * seq;
  const T* d = dout + (b * seq + t) * C + h * hs;
  float dot = 0;
  for (int64_t t2 = 0; t2 <= t; ++t2) {
    const T* v = qkv + (b * seq + t2) * 3 * C + 2 * C + h * hs;
    float s = 0;
    for (int64_t i = 0; i < hs; ++i) s += to_f(v[i]) * to_f(d[i]);
    dp[t2] = s;  // datt for now
    dot += a[t2] * s;
  }
  for (int64_t t2 = 0; t2 <= t; ++t2) dp[t2] = a[t2] * (dp[t2] - dot);
  T* dq = dqkv + (b * seq + t) * 3 * C + h * hs;
  for (int64_t i = 0; i < hs; ++i) {
    float acc = 0;
    for (int64_t t2 = 0; t2 <= t; ++t2) acc += dp[t2] * to_f(qkv[(b * seq + t2) * 3 * C + C + h * hs + i]);
    add_to(&dq[i], acc * scale);
  }
}

// Pass 2, one thread per (b, h, t2): dk[t2] and dv[t2] from every t >= t2.
template <class T>
__global__ void attention_backward_kv_kernel(T* dqkv, const float* dpre, const T* dout, const T* qkv,
                                             const float* att, int64_t B, int64_t seq, int64_t C, int64_t NH) {
  int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= B * NH * seq) return;
  int64_t t2 = idx % seq, h = (idx / seq) % NH, b = idx / (seq * NH);
  int64_t hs = C / NH;
  float scale = rsqrtf(static_cast<float>(hs));
  T* dk = dqkv + (b * seq + t2) * 3 * C + C + h * hs;
  T* dv = dqkv + (b * seq + t2) * 3 * C + 2 * C + h * hs;
  for (int64_t i = 0; i < hs; ++i) {
    float sk = 0, sv = 0;
    for (int64_t t = t2; t < seq; ++t) {
      int64_t row = ((b * NH + h) * seq + t) * seq + t2;
      sk += dpre[row] * to_f(qkv[(b * seq + t) * 3 * C + h * hs + i]);
      sv += att[row] * to_f(dout[(b * seq + t) * C + h * hs + i]);
    }
    add_to(&dk[i], sk * scale);
    add_to(&dv[i], sv);
  }
}

constexpr float kGeluScale = 0.79788456080286535587989211986876f;  // sqrt(2/pi)

template <class T>
__global__ void gelu_forward_kernel(T* out, const T* x, int64_t n) {
  int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float v = to_f(x[i]);
  out[i] = from_f<T>(0.5f * v * (1.0f + tanhf(kGeluScale * (v + 0.044715f * v * v * v))));
}

template <class T>
__global__ void gelu_backward_kernel(T* dx, const T* x, const T* dout, int64_t n) {
  int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float v = to_f(x[i]);
  float th = tanhf(kGeluScale * (v + 0.044715f * v * v * v));
  float sech2 = 1.0f - th * th;
  float local = 0.5f * (1.0f + th) + v * 0.5f * sech2 * kGeluScale * (1.0f + 3.0f * 0.044715f * v * v);
  add_to(&dx[i], local * to_f(dout[i]));
}

template <class T>
__global__ void add_kernel(T* out, const T* a, const T* b, int64_t n) {
  int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = from_f<T>(to_f(a[i]) + to_f(b[i]));
}

}  // namespace

template <class T>
Status embedding_forward(cudaStream_t s, T* out, const int32_t* tokens, const T* wte, const T* wpe,
                         int64_t B, int64_t seq, int64_t C) {
  embedding_forward_kernel<<<blocks_for(B * seq * C), kThreads, 0, s>>>(out, tokens, wte, wpe, B * seq, seq, C);
  return launched("embedding_forward");
}

template <class T>
Status embedding_backward(cudaStream_t s, T* dwte, T* dwpe, const T* dout, const int32_t* tokens,
                          int64_t B, int64_t seq, int64_t C) {
  embedding_backward_kernel<<<blocks_for(C), kThreads, 0, s>>>(dwte, dwpe, dout, tokens, B * seq, seq, C);
  return launched("embedding_backward");
}

template <class T>
Status layernorm_forward(cudaStream_t s, T* out, float* mean, float* rstd, const T* x, const T* w, const T* b,
                         int64_t N, int64_t C) {
  unsigned blocks = static_cast<unsigned>((N + kThreads / 32 - 1) / (kThreads / 32));
  layernorm_forward_kernel<<<blocks, kThreads, 0, s>>>(out, mean, rstd, x, w, b, N, C);
  return launched("layernorm_forward");
}

template <class T>
Status layernorm_backward(cudaStream_t s, T* dx, T* dw, T* db, const T* dout, const T* x, const T* w,
                          const float* mean, const float* rstd, int64_t N, int64_t C) {
  unsigned blocks = static_cast<unsigned>((N + kThreads / 32 - 1) / (kThreads / 32));
  layernorm_backward_dx_kernel<<<blocks, kThreads, 0, s>>>(dx, dout, x, w, mean, rstd, N, C);
  STRATA_RETURN_IF_ERROR(launched("layernorm_backward dx"));
  layernorm_backward_dwdb_kernel<<<blocks_for(C), kThreads, 0, s>>>(dw, db, dout, x, mean, rstd, N, C);
  return launched("layernorm_backward dw/db");
}

template <class T>
Status matmul_forward(const BlasContext& ctx, cudaStream_t s, T* out, const T* x, const T* w, const T* bias,
                      int64_t N, int64_t IC, int64_t OC) {
  return gemm(ctx, s, false, false, N, OC, IC, x, IC, w, OC, 0.0f, out, OC, bias);
}

template <class T>
Status matmul_backward(const BlasContext& ctx, cudaStream_t s, T* dx, T* dw, T* dbias, const T* dout, const T* x,
                       const T* w, int64_t N, int64_t IC, int64_t OC) {
  STRATA_RETURN_IF_ERROR(gemm(ctx, s, false, true, N, IC, OC, dout, OC, w, OC, 1.0f, dx, IC));
  STRATA_RETURN_IF_ERROR(gemm(ctx, s, true, false, IC, OC, N, x, IC, dout, OC, 1.0f, dw, OC));
  if (dbias == nullptr) return ok_status();
  column_sum_kernel<<<blocks_for(OC), kThreads, 0, s>>>(dbias, dout, N, OC);
  return launched("matmul_backward dbias");
}

template <class T>
Status attention_forward(cudaStream_t s, T* out, float* att, const T* qkv, int64_t B, int64_t seq, int64_t C,
                         int64_t NH) {
  attention_forward_kernel<<<blocks_for(B * NH * seq), kThreads, 0, s>>>(out, att, qkv, B, seq, C, NH);
  return launched("attention_forward");
}

template <class T>
Status attention_backward(cudaStream_t s, T* dqkv, float* dpre, const T* dout, const T* qkv, const float* att,
                          int64_t B, int64_t seq, int64_t C, int64_t NH) {
  attention_backward_q_kernel<<<blocks_for(B * NH * seq), kThreads, 0, s>>>(dqkv, dpre, dout, qkv, att, B, seq, C,
                                                                             NH);
  STRATA_RETURN_IF_ERROR(launched("attention_backward q"));
  attention_backward_kv_kernel<<<blocks_for(B * NH * seq), kThreads, 0, s>>>(dqkv, dpre, dout, qkv, att, B, seq, C,
                                                                              NH);
  return launched("attention_backward k/v");
}

template <class T>
Status gelu_forward(cudaStream_t s, T* out, const T* x, int64_t n) {
  gelu_forward_kernel<<<blocks_for(n), kThreads, 0, s>>>(out, x, n);
  return launched("gelu_forward");
}

template <class T>
Status gelu_backward(cudaStream_t s, T* dx, const T* x, const T* dout, int64_t n) {
  gelu_backward_kernel<<<blocks_for(n), kThreads, 0, s>>>(dx, x, dout, n);
  return launched("gelu_backward");
}

template <class T>
Status residual_forward(cudaStream_t s, T* out, const T* a, const T* b, int64_t n) {
  add_kernel<<<blocks_for(n), kThreads, 0, s>>>(out, a, b, n);
  return launched("residual_forward");
}

template <class T>
Status accumulate(cudaStream_t s, T* dst, const T* src, int64_t n) {
  add_kernel<<<blocks_for(n), kThreads, 0, s>>>(dst, dst, src, n);
  return launched("accumulate");
}

#define STRATA_CUDA_OPS_INSTANTIATE(T)                                                                            \
  template Status embedding_forward<T>(cudaStream_t, T*, const int32_t*, const T*, const T*, int64_t, int64_t,     \
                                       int64_t);                                                                 \
  template Status embedding_backward<T>(cudaStream_t, T*, T*, const T*, const int32_t*, int64_t, int64_t,          \
                                        int64_t);                                                                \
  template Status layernorm_forward<T>(cudaStream_t, T*, float*, float*, const T*, const T*, const T*, int64_t,    \
                                       int64_t);                                                                 \
  template Status layernorm_backward<T>(cudaStream_t, T*, T*, T*, const T*, const T*, const T*, const float*,      \
                                        const float*, int64_t, int64_t);                                         \
  template Status matmul_forward<T>(const BlasContext&, cudaStream_t, T*, const T*, const T*, const T*, int64_t,   \
                                    int64_t, int64_t);                                                           \
  template Status matmul_backward<T>(const BlasContext&, cudaStream_t, T*, T*, T*, const T*, const T*, const T*,   \
                                     int64_t, int64_t, int64_t);                                                 \
  template Status attention_forward<T>(cudaStream_t, T*, float*, const T*, int64_t, int64_t, int64_t, int64_t);    \
  template Status attention_backward<T>(cudaStream_t, T*, float*, const T*, const T*, const float*, int64_t,       \
                                        int64_t, int64_t, int64_t);                                              \
  template Status gelu_forward<T>(cudaStream_t, T*, const T*, int64_t);                                            \
  template Status gelu_backward<T>(cudaStream_t, T*, const T*, const T*, int64_t);                                 \
  template Status residual_forward<T>(cudaStream_t, T*, const T*, const T*, int64_t);                              \
  template Status accumulate<T>(cudaStream_t, T*, const T*, int64_t);

STRATA_CUDA_OPS_INSTANTIATE(float)
STRATA_CUDA_OPS_INSTANTIATE(__nv_bfloat16)
STRATA_CUDA_OPS_INSTANTIATE(__half)

}  // namespace strata::gpu::cuda
