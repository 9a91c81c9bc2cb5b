// fp32 CUDA kernels of the transformer ops; formulas as gpu/host/ops.cpp.
// Correct first: one thread (or one warp) per row and ordered reductions,
// so every result is deterministic. Fused attention and bf16/fp16 kernels
// come next (docs/GPT.md).
#include <cmath>
#include <limits>

#include "gpu/cuda/cuda_check.h"
#include "gpu/cuda/ops.h"

namespace strata::gpu::cuda {
namespace {

constexpr int kThreads = 256;

unsigned blocks_for(int64_t n) { return static_cast<unsigned>((n + kThreads - 1) / kThreads); }

Status launched(const char* what) { return cuda_status(cudaGetLastError(), what); }

__device__ float warp_sum(float v) {
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

__global__ void embedding_forward_kernel(float* out, const int32_t* tokens, const float* wte, const float* wpe,
                                         int64_t N, int64_t seq, int64_t C) {
  int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= N * C) return;
  int64_t n = i / C, c = i % C;
  out[i] = wte[static_cast<int64_t>(tokens[n]) * C + c] + wpe[(n % seq) * C + c];
}

// One thread per channel walks the rows in order: deterministic, no atomics.
__global__ void embedding_backward_kernel(float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                                          int64_t N, int64_t seq, int64_t C) {
  int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= C) return;
  for (int64_t n = 0; n < N; ++n) {
    float d = dout[n * C + c];
    dwte[static_cast<int64_t>(tokens[n]) * C + c] += d;
    dwpe[(n % seq) * C + c] += d;
  }
}

// One warp per row.
__global__ void layernorm_forward_kernel(float* out, float* mean, float* rstd, const float* x, const float* w,
                                         const float* b, int64_t N, int64_t C) {
  int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  int lane = threadIdx.x % 32;
  if (row >= N) return;
  const float* xr = x + row * C;
  float s = 0;
  for (int64_t i = lane; i < C; i += 32) s += xr[i];
  float m = warp_sum(s) / static_cast<float>(C);
  float v = 0;
  for (int64_t i = lane; i < C; i += 32) v += (xr[i] - m) * (xr[i] - m);
  float r = rsqrtf(warp_sum(v) / static_cast<float>(C) + 1e-5f);
  for (int64_t i = lane; i < C; i += 32) out[row * C + i] = (xr[i] - m) * r * w[i] + b[i];
  if (lane == 0) {
    mean[row] = m;
    rstd[row] = r;
  }
}

__global__ void layernorm_backward_dx_kernel(float* dx, const float* dout, const float* x, const float* w,
                                             const float* mean, const float* rstd, int64_t N, int64_t C) {
  int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  int lane = threadIdx.x % 32;
  if (row >= N) return;
  const float* d = dout + row * C;
  const float* xr = x + row * C;
  float a = 0, bsum = 0;
  for (int64_t i = lane; i < C; i += 32) {
    float norm = (xr[i] - mean[row]) * rstd[row];
    float dnorm = w[i] * d[i];
    a += dnorm;
    bsum += dnorm * norm;
  }
  float dnorm_mean = warp_sum(a) / static_cast<float>(C);
  float dnorm_norm_mean = warp_sum(bsum) / static_cast<float>(C);
  for (int64_t i = lane; i < C; i += 32) {
    float norm = (xr[i] - mean[row]) * rstd[row];
    dx[row * C + i] += (w[i] * d[i] - dnorm_mean - norm * dnorm_norm_mean) * rstd[row];
  }
}

__global__ void layernorm_backward_dwdb_kernel(float* dw, float* db, const float* dout, const float* x,
                                               const float* mean, const float* rstd, int64_t N, int64_t C) {
  int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= C) return;
  float sw = 0, sb = 0;
  for (int64_t n = 0; n < N; ++n) {
    float d = dout[n * C + c];
    sw += (x[n * C + c] - mean[n]) * rstd[n] * d;
    sb += d;
  }
  dw[c] += sw;
  db[c] += sb;
}

__global__ void column_sum_kernel(float* dbias, const float* dout, int64_t N, int64_t OC) {
  int64_t o = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (o >= OC) return;
  float s = 0;
  for (int64_t n = 0; n < N; ++n) s += dout[n * OC + o];
  dbias[o] += s;
}

// One thread per (b, h, t): scores over t2 <= t, softmax, weighted sum of v.
__global__ void attention_forward_kernel(float* out, float* att, const float* qkv, int64_t B, int64_t seq, int64_t C,
                                         int64_t NH) {
  int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= B * NH * seq) return;
  int64_t t = idx % seq, h = (idx / seq) % NH, b = idx / (seq * NH);
  int64_t hs = C / NH;
  float scale = rsqrtf(static_cast<float>(hs));
  const float* q = qkv + (b * seq + t) * 3 * C + h * hs;
  float* a = att + ((b * NH + h) * seq + t) * seq;
  float maxval = -INFINITY;
  for (int64_t t2 = 0; t2 <= t; ++t2) {
    const float* k = qkv + (b * seq + t2) * 3 * C + C + h * hs;
    float s = 0;
    for (int64_t i = 0; i < hs; ++i) s += q[i] * k[i];
    a[t2] = s * scale;
    maxval = fmaxf(maxval, a[t2]);
  }
  float sum = 0;
  for (int64_t t2 = 0; t2 <= t; ++t2) {
    a[t2] = expf(a[t2] - maxval);
    sum += a[t2];
  }
  for (int64_t t2 = 0; t2 < seq; ++t2) a[t2] = t2 <= t ? a[t2] / sum : 0.0f;
  float* o = out + (b * seq + t) * C + h * hs;
  for (int64_t i = 0; i < hs; ++i) {
    float acc = 0;
    for (int64_t t2 = 0; t2 <= t; ++t2) acc += a[t2] * qkv[(b * seq + t2) * 3 * C + 2 * C + h * hs + i];
    o[i] = acc;
  }
}

// Pass 1, one thread per (b, h, t): dpre[t, :] and dq[t].
__global__ void attention_backward_q_kernel(float* dqkv, float* dpre, const float* dout, const float* qkv,
                                            const float* att, int64_t B, int64_t seq, int64_t C, int64_t NH) {
  int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= B * NH * seq) return;
  int64_t t = idx % seq, h = (idx / seq) % NH, b = idx / (seq * NH);
  int64_t hs = C / NH;
  float scale = rsqrtf(static_cast<float>(hs));
  const float* a = att + ((b * NH + h) * seq + t) * seq;
  float* dp = dpre + ((b * NH + h) * seq + t) * seq;
  const float* d = dout + (b * seq + t) * C + h * hs;
  float dot = 0;
  for (int64_t t2 = 0; t2 <= t; ++t2) {
    const float* v = qkv + (b * seq + t2) * 3 * C + 2 * C + h * hs;
    float s = 0;
    for (int64_t i = 0; i < hs; ++i) s += v[i] * d[i];
    dp[t2] = s;  // datt for now
    dot += a[t2] * s;
  }
  for (int64_t t2 = 0; t2 <= t; ++t2) dp[t2] = a[t2] * (dp[t2] - dot);
  float* dq = dqkv + (b * seq + t) * 3 * C + h * hs;
  for (int64_t i = 0; i < hs; ++i) {
    float acc = 0;
    for (int64_t t2 = 0; t2 <= t; ++t2) acc += dp[t2] * qkv[(b * seq + t2) * 3 * C + C + h * hs + i];
    dq[i] += acc * scale;
  }
}

// Pass 2, one thread per (b, h, t2): dk[t2] and dv[t2] from every t >= t2.
__global__ void attention_backward_kv_kernel(float* dqkv, const float* dpre, const float* dout, const float* qkv,
                                             const float* att, int64_t B, int64_t seq, int64_t C, int64_t NH) {
  int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= B * NH * seq) return;
  int64_t t2 = idx % seq, h = (idx / seq) % NH, b = idx / (seq * NH);
  int64_t hs = C / NH;
  float scale = rsqrtf(static_cast<float>(hs));
  float* dk = dqkv + (b * seq + t2) * 3 * C + C + h * hs;
  float* dv = dqkv + (b * seq + t2) * 3 * C + 2 * C + h * hs;
  for (int64_t i = 0; i < hs; ++i) {
    float sk = 0, sv = 0;
    for (int64_t t = t2; t < seq; ++t) {
      int64_t row = ((b * NH + h) * seq + t) * seq + t2;
      sk += dpre[row] * qkv[(b * seq + t) * 3 * C + h * hs + i];
      sv += att[row] * dout[(b * seq + t) * C + h * hs + i];
    }
    dk[i] += sk * scale;
    dv[i] += sv;
  }
}

constexpr float kGeluScale = 0.79788456080286535587989211986876f;  // sqrt(2/pi)

__global__ void gelu_forward_kernel(float* out, const float* x, int64_t n) {
  int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float v = x[i];
  out[i] = 0.5f * v * (1.0f + tanhf(kGeluScale * (v + 0.044715f * v * v * v)));
}

__global__ void gelu_backward_kernel(float* dx, const float* x, const float* dout, int64_t n) {
  int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float v = x[i];
  float th = tanhf(kGeluScale * (v + 0.044715f * v * v * v));
  float sech2 = 1.0f - th * th;
  float local = 0.5f * (1.0f + th) + v * 0.5f * sech2 * kGeluScale * (1.0f + 3.0f * 0.044715f * v * v);
  dx[i] += local * dout[i];
}

__global__ void add_kernel(float* out, const float* a, const float* b, int64_t n) {
  int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = a[i] + b[i];
}

}  // namespace

Status embedding_forward(cudaStream_t s, float* out, const int32_t* tokens, const float* wte, const float* wpe,
                         int64_t B, int64_t seq, int64_t C) {
  embedding_forward_kernel<<<blocks_for(B * seq * C), kThreads, 0, s>>>(out, tokens, wte, wpe, B * seq, seq, C);
  return launched("embedding_forward");
}

Status embedding_backward(cudaStream_t s, float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                          int64_t B, int64_t seq, int64_t C) {
  embedding_backward_kernel<<<blocks_for(C), kThreads, 0, s>>>(dwte, dwpe, dout, tokens, B * seq, seq, C);
  return launched("embedding_backward");
}

Status layernorm_forward(cudaStream_t s, float* out, float* mean, float* rstd, const float* x, const float* w,
                         const float* b, int64_t N, int64_t C) {
  unsigned blocks = static_cast<unsigned>((N + kThreads / 32 - 1) / (kThreads / 32));
  layernorm_forward_kernel<<<blocks, kThreads, 0, s>>>(out, mean, rstd, x, w, b, N, C);
  return launched("layernorm_forward");
}

Status layernorm_backward(cudaStream_t s, float* dx, float* dw, float* db, const float* dout, const float* x,
                          const float* w, const float* mean, const float* rstd, int64_t N, int64_t C) {
  unsigned blocks = static_cast<unsigned>((N + kThreads / 32 - 1) / (kThreads / 32));
  layernorm_backward_dx_kernel<<<blocks, kThreads, 0, s>>>(dx, dout, x, w, mean, rstd, N, C);
  STRATA_RETURN_IF_ERROR(launched("layernorm_backward dx"));
  layernorm_backward_dwdb_kernel<<<blocks_for(C), kThreads, 0, s>>>(dw, db, dout, x, mean, rstd, N, C);
  return launched("layernorm_backward dw/db");
}

Status matmul_forward(const BlasContext& ctx, cudaStream_t s, float* out, const float* x, const float* w,
                      const float* bias, int64_t N, int64_t IC, int64_t OC) {
  return gemm(ctx, s, false, false, N, OC, IC, x, IC, w, OC, 0.0f, out, OC, bias);
}

Status matmul_backward(const BlasContext& ctx, cudaStream_t s, float* dx, float* dw, float* dbias, const float* dout,
                       const float* x, const float* w, int64_t N, int64_t IC, int64_t OC) {
  STRATA_RETURN_IF_ERROR(gemm(ctx, s, false, true, N, IC, OC, dout, OC, w, OC, 1.0f, dx, IC));
  STRATA_RETURN_IF_ERROR(gemm(ctx, s, true, false, IC, OC, N, x, IC, dout, OC, 1.0f, dw, OC));
  if (dbias == nullptr) return ok_status();
  column_sum_kernel<<<blocks_for(OC), kThreads, 0, s>>>(dbias, dout, N, OC);
  return launched("matmul_backward dbias");
}

Status attention_forward(cudaStream_t s, float* out, float* att, const float* qkv, int64_t B, int64_t seq, int64_t C,
                         int64_t NH) {
  attention_forward_kernel<<<blocks_for(B * NH * seq), kThreads, 0, s>>>(out, att, qkv, B, seq, C, NH);
  return launched("attention_forward");
}

Status attention_backward(cudaStream_t s, float* dqkv, float* dpre, const float* dout, const float* qkv,
                          const float* att, int64_t B, int64_t seq, int64_t C, int64_t NH) {
  attention_backward_q_kernel<<<blocks_for(B * NH * seq), kThreads, 0, s>>>(dqkv, dpre, dout, qkv, att, B, seq, C,
                                                                             NH);
  STRATA_RETURN_IF_ERROR(launched("attention_backward q"));
  attention_backward_kv_kernel<<<blocks_for(B * NH * seq), kThreads, 0, s>>>(dqkv, dpre, dout, qkv, att, B, seq, C,
                                                                              NH);
  return launched("attention_backward k/v");
}

Status gelu_forward(cudaStream_t s, float* out, const float* x, int64_t n) {
  gelu_forward_kernel<<<blocks_for(n), kThreads, 0, s>>>(out, x, n);
  return launched("gelu_forward");
}

Status gelu_backward(cudaStream_t s, float* dx, const float* x, const float* dout, int64_t n) {
  gelu_backward_kernel<<<blocks_for(n), kThreads, 0, s>>>(dx, x, dout, n);
  return launched("gelu_backward");
}

Status residual_forward(cudaStream_t s, float* out, const float* a, const float* b, int64_t n) {
  add_kernel<<<blocks_for(n), kThreads, 0, s>>>(out, a, b, n);
  return launched("residual_forward");
}

Status accumulate(cudaStream_t s, float* dst, const float* src, int64_t n) {
  add_kernel<<<blocks_for(n), kThreads, 0, s>>>(dst, dst, src, n);
  return launched("accumulate");
}

}  // namespace strata::gpu::cuda
