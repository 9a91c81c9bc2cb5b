// The tied output projection fused with softmax cross-entropy, on the GPU:
// logits are produced kCeRows x kCeCols at a time by cuBLASLt into the
// workspace, folded into a per-row online log-sum-exp, and never stored
// whole (at GPT-2's vocabulary a full [B*T, V] fp32 logits tensor is the
// largest activation of the model). Backward recomputes each chunk. In
// bf16/fp16 the logits chunk and its gradient are stored in that type (as
// the GEMMs produce and consume them); the running max/sum, lse and loss
// are fp32.
#include <cmath>

#include "gpu/cuda/cuda_check.h"
#include "gpu/cuda/element.cuh"
#include "gpu/cuda/ops.h"

namespace strata::gpu::cuda {
namespace {

using detail::blocks_for;
using detail::from_f;
using detail::kThreads;
using detail::to_f;

struct Workspace {
  float* logits;        // [kCeRows, kCeCols]
  float* run_max;       // [N]
  float* run_sum;       // [N]
  float* target_logit;  // [N]
  float* losses;        // [N]
};

Workspace carve(float* base, int64_t N) {
  float* p = base + kCeRows * kCeCols;
  return {base, p, p + N, p + 2 * N, p + 3 * N};
}

__global__ void init_rows_kernel(float* run_max, float* run_sum, int64_t N) {
  int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= N) return;
  run_max[i] = -INFINITY;
  run_sum[i] = 0.0f;
}

// One thread per row of the chunk: fold its cols logits into the running
// maximum and sum (rescaled to the new maximum), and catch the target logit.
template <class T>
__global__ void fold_chunk_kernel(const T* logits, float* run_max, float* run_sum, float* target_logit,
                                  const int32_t* targets, int64_t rows, int64_t cols, int64_t v0) {
  int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  const T* l = logits + r * cols;
  float m = run_max[r];
  for (int64_t j = 0; j < cols; ++j) m = fmaxf(m, to_f(l[j]));
  float s = run_sum[r] * expf(run_max[r] - m);
  for (int64_t j = 0; j < cols; ++j) s += expf(to_f(l[j]) - m);
  run_max[r] = m;
  run_sum[r] = s;
  int64_t tgt = targets[r];
  if (tgt >= v0 && tgt < v0 + cols) target_logit[r] = to_f(l[tgt - v0]);
}

__global__ void finish_rows_kernel(float* lse, float* losses, const float* run_max, const float* run_sum,
                                   const float* target_logit, int64_t N) {
  int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= N) return;
  lse[i] = run_max[i] + logf(run_sum[i]);
  losses[i] = lse[i] - target_logit[i];
}

// Mean in row order: deterministic.
__global__ void mean_kernel(float* out, const float* losses, int64_t N) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  double s = 0;
  for (int64_t i = 0; i < N; ++i) s += losses[i];
  *out = static_cast<float>(s / static_cast<double>(N));
}

template <class T>
__global__ void dlogits_kernel(T* l, const float* lse, const int32_t* targets, float k, int64_t rows,
                               int64_t cols, int64_t v0) {
  int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * cols) return;
  int64_t r = i / cols, j = i % cols;
  float g = expf(to_f(l[i]) - lse[r]) * k;
  if (targets[r] == v0 + j) g -= k;
  l[i] = from_f<T>(g);
}

}  // namespace

template <class T>
Status crossentropy_forward(const BlasContext& ctx, cudaStream_t s, float* loss_out, float* lse, float* workspace,
                            const T* x, const T* wte, const int32_t* targets, int64_t N, int64_t C, int64_t V) {
  Workspace w = carve(workspace, N);
  T* logits = reinterpret_cast<T*>(w.logits);  // the chunk in T (fits: sizeof(T) <= 4)
  init_rows_kernel<<<blocks_for(N), kThreads, 0, s>>>(w.run_max, w.run_sum, N);
  STRATA_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  for (int64_t r0 = 0; r0 < N; r0 += kCeRows) {
    const int64_t rows = std::min(kCeRows, N - r0);
    for (int64_t v0 = 0; v0 < V; v0 += kCeCols) {
      const int64_t cols = std::min(kCeCols, V - v0);
      STRATA_RETURN_IF_ERROR(gemm(ctx, s, false, true, rows, cols, C, x + r0 * C, C, wte + v0 * C, C, 0.0f,
                                  logits, cols));
      fold_chunk_kernel<<<blocks_for(rows), kThreads, 0, s>>>(logits, w.run_max + r0, w.run_sum + r0,
                                                               w.target_logit + r0, targets + r0, rows, cols, v0);
      STRATA_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    }
  }
  finish_rows_kernel<<<blocks_for(N), kThreads, 0, s>>>(lse, w.losses, w.run_max, w.run_sum, w.target_logit, N);
  STRATA_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  mean_kernel<<<1, 1, 0, s>>>(loss_out, w.losses, N);
  STRATA_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return ok_status();
}

template <class T>
Status crossentropy_backward(const BlasContext& ctx, cudaStream_t s, T* dx, T* dwte, float* workspace, const T* x,
                             const T* wte, const int32_t* targets, const float* lse, float dloss, int64_t N,
                             int64_t C, int64_t V) {
  Workspace w = carve(workspace, N);
  T* logits = reinterpret_cast<T*>(w.logits);
  const float k = dloss / static_cast<float>(N);
  for (int64_t r0 = 0; r0 < N; r0 += kCeRows) {
    const int64_t rows = std::min(kCeRows, N - r0);
    for (int64_t v0 = 0; v0 < V; v0 += kCeCols) {
      const int64_t cols = std::min(kCeCols, V - v0);
      STRATA_RETURN_IF_ERROR(gemm(ctx, s, false, true, rows, cols, C, x + r0 * C, C, wte + v0 * C, C, 0.0f,
                                  logits, cols));
      dlogits_kernel<<<blocks_for(rows * cols), kThreads, 0, s>>>(logits, lse + r0, targets + r0, k, rows, cols,
                                                                   v0);
      STRATA_CUDA_RETURN_IF_ERROR(cudaGetLastError());
      STRATA_RETURN_IF_ERROR(
          gemm(ctx, s, false, false, rows, C, cols, logits, cols, wte + v0 * C, C, 1.0f, dx + r0 * C, C));
      STRATA_RETURN_IF_ERROR(
          gemm(ctx, s, true, false, cols, C, rows, logits, cols, x + r0 * C, C, 1.0f, dwte + v0 * C, C));
    }
  }
  return ok_status();
}

#define STRATA_CE_INSTANTIATE(T)                                                                                   \
  template Status crossentropy_forward<T>(const BlasContext&, cudaStream_t, float*, float*, float*, const T*,      \
                                          const T*, const int32_t*, int64_t, int64_t, int64_t);                    \
  template Status crossentropy_backward<T>(const BlasContext&, cudaStream_t, T*, T*, float*, const T*, const T*,   \
                                           const int32_t*, const float*, float, int64_t, int64_t, int64_t);

STRATA_CE_INSTANTIATE(float)
STRATA_CE_INSTANTIATE(__nv_bfloat16)
STRATA_CE_INSTANTIATE(__half)

}  // namespace strata::gpu::cuda
