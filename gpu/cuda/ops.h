// Host launchers of the CUDA ops. Each mirrors the host op of the same name
// in gpu/host/ops.h — same shapes, same accumulate (+=) semantics for
// gradients — and takes an explicit stream. Tensors are T = float,
// __nv_bfloat16 or __half (fp16 for V100-class GPUs), computed and
// accumulated in fp32; LayerNorm statistics, attention probabilities and the
// loss are fp32. Kernels are static in the .cu files. Reductions are ordered
// (no atomics), so results are deterministic run to run. `ctx` carries the
// cuBLASLt handle.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "common/status.h"
#include "gpu/cuda/crossentropy_workspace.h"

struct cublasLtContext;

namespace strata::gpu::cuda {

// Owns a cuBLASLt handle, created and destroyed with its device current.
class BlasContext {
 public:
  static Result<BlasContext> create(int device);
  BlasContext() = default;
  BlasContext(BlasContext&& other) noexcept;
  BlasContext& operator=(BlasContext&& other) noexcept;
  BlasContext(const BlasContext&) = delete;
  BlasContext& operator=(const BlasContext&) = delete;
  ~BlasContext();
  cublasLtContext* handle() const { return handle_; }
  int device() const { return device_; }

 private:
  cublasLtContext* handle_ = nullptr;
  int device_ = -1;
};

// Row-major C[M,N] = op(A)[M,K] @ op(B)[K,N] (+ bias[N] per row when given) + beta * C,
// all of type T (float, __nv_bfloat16, __half), fp32 accumulation.
template <class T>
Status gemm(const BlasContext& ctx, cudaStream_t stream, bool ta, bool tb, int64_t M, int64_t N, int64_t K,
            const T* A, int64_t lda, const T* B, int64_t ldb, float beta, T* C, int64_t ldc,
            const T* bias = nullptr);

template <class T>
Status embedding_forward(cudaStream_t s, T* out, const int32_t* tokens, const T* wte, const T* wpe, int64_t B,
                         int64_t seq, int64_t C);
template <class T>
Status embedding_backward(cudaStream_t s, T* dwte, T* dwpe, const T* dout, const int32_t* tokens, int64_t B,
                          int64_t seq, int64_t C);
template <class T>
Status layernorm_forward(cudaStream_t s, T* out, float* mean, float* rstd, const T* x, const T* w, const T* b,
                         int64_t N, int64_t C);
template <class T>
Status layernorm_backward(cudaStream_t s, T* dx, T* dw, T* db, const T* dout, const T* x, const T* w,
                          const float* mean, const float* rstd, int64_t N, int64_t C);
template <class T>
Status matmul_forward(const BlasContext& ctx, cudaStream_t s, T* out, const T* x, const T* w, const T* bias,
                      int64_t N, int64_t IC, int64_t OC);
template <class T>
Status matmul_backward(const BlasContext& ctx, cudaStream_t s, T* dx, T* dw, T* dbias, const T* dout, const T* x,
                       const T* w, int64_t N, int64_t IC, int64_t OC);
// att: B*NH*T*T fp32 probabilities.
template <class T>
Status attention_forward(cudaStream_t s, T* out, float* att, const T* qkv, int64_t B, int64_t seq, int64_t C,
                         int64_t NH);
// dpre_workspace: B*NH*T*T floats.
template <class T>
Status attention_backward(cudaStream_t s, T* dqkv, float* dpre_workspace, const T* dout, const T* qkv,
                          const float* att, int64_t B, int64_t seq, int64_t C, int64_t NH);
// Fused causal attention (flash_attention.cu; the host's flash_attention_*
// have the same contract): no [T,T] matrix; lse[B*NH*T] fp32 log-sum-exp per
// row kept for backward, which recomputes the probabilities. Head size
// C/NH at most kMaxFlashHeadSize; a larger one is InvalidArgument.
inline constexpr int64_t kMaxFlashHeadSize = 128;
template <class T>
Status flash_attention_forward(cudaStream_t s, T* out, float* lse, const T* qkv, int64_t B, int64_t seq, int64_t C,
                               int64_t NH);
// dqkv += from dout; out is the forward's output; workspace: B*NH*T floats.
template <class T>
Status flash_attention_backward(cudaStream_t s, T* dqkv, float* workspace, const T* dout, const T* out, const T* qkv,
                                const float* lse, int64_t B, int64_t seq, int64_t C, int64_t NH);
template <class T>
Status gelu_forward(cudaStream_t s, T* out, const T* x, int64_t n);
template <class T>
Status gelu_backward(cudaStream_t s, T* dx, const T* x, const T* dout, int64_t n);
template <class T>
Status residual_forward(cudaStream_t s, T* out, const T* a, const T* b, int64_t n);
template <class T>
Status accumulate(cudaStream_t s, T* dst, const T* src, int64_t n);

// Fused tied projection + cross-entropy (gpu/host/ops.h), never more than
// kCeRows x kCeCols logits at once (in T; the row statistics, lse and the
// loss in fp32). workspace: crossentropy_workspace_floats() (crossentropy_workspace.h).
// loss_out: one device float, the mean loss; lse[N] saved for backward.
template <class T>
Status crossentropy_forward(const BlasContext& ctx, cudaStream_t s, float* loss_out, float* lse, float* workspace,
                            const T* x, const T* wte, const int32_t* targets, int64_t N, int64_t C, int64_t V);
template <class T>
Status crossentropy_backward(const BlasContext& ctx, cudaStream_t s, T* dx, T* dwte, float* workspace, const T* x,
                             const T* wte, const int32_t* targets, const float* lse, float dloss, int64_t N,
                             int64_t C, int64_t V);

}  // namespace strata::gpu::cuda
