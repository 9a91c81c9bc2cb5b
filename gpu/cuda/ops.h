// Host launchers of the CUDA ops (fp32). Each mirrors the host op of the
// same name in gpu/host/ops.h — same shapes, same accumulate (+=) semantics
// for gradients — and takes an explicit stream. Kernels are static in the
// .cu files. Reductions are ordered (no atomics), so results are
// deterministic run to run. `ctx` carries the cuBLASLt handle.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/status.h"

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

// Row-major C[M,N] = op(A)[M,K] @ op(B)[K,N] (+ bias[N] per row when given) + beta * C.
Status gemm(const BlasContext& ctx, cudaStream_t stream, bool ta, bool tb, int64_t M, int64_t N, int64_t K,
            const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc,
            const float* bias = nullptr);

Status embedding_forward(cudaStream_t s, float* out, const int32_t* tokens, const float* wte, const float* wpe,
                         int64_t B, int64_t seq, int64_t C);
Status embedding_backward(cudaStream_t s, float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                          int64_t B, int64_t seq, int64_t C);
Status layernorm_forward(cudaStream_t s, float* out, float* mean, float* rstd, const float* x, const float* w,
                         const float* b, int64_t N, int64_t C);
Status layernorm_backward(cudaStream_t s, float* dx, float* dw, float* db, const float* dout, const float* x,
                          const float* w, const float* mean, const float* rstd, int64_t N, int64_t C);
Status matmul_forward(const BlasContext& ctx, cudaStream_t s, float* out, const float* x, const float* w,
                      const float* bias, int64_t N, int64_t IC, int64_t OC);
Status matmul_backward(const BlasContext& ctx, cudaStream_t s, float* dx, float* dw, float* dbias, const float* dout,
                       const float* x, const float* w, int64_t N, int64_t IC, int64_t OC);
Status attention_forward(cudaStream_t s, float* out, float* att, const float* qkv, int64_t B, int64_t seq, int64_t C,
                         int64_t NH);
// dpre_workspace: B*NH*T*T floats.
Status attention_backward(cudaStream_t s, float* dqkv, float* dpre_workspace, const float* dout, const float* qkv,
                          const float* att, int64_t B, int64_t seq, int64_t C, int64_t NH);
Status gelu_forward(cudaStream_t s, float* out, const float* x, int64_t n);
Status gelu_backward(cudaStream_t s, float* dx, const float* x, const float* dout, int64_t n);
Status residual_forward(cudaStream_t s, float* out, const float* a, const float* b, int64_t n);
Status accumulate(cudaStream_t s, float* dst, const float* src, int64_t n);

// Fused tied projection + cross-entropy (gpu/host/ops.h), never more than
// kCeRows x kCeCols logits at once. workspace: crossentropy_workspace_floats().
inline constexpr int64_t kCeRows = 256;
inline constexpr int64_t kCeCols = 4096;
int64_t crossentropy_workspace_floats(int64_t N);
// loss_out: one device float, the mean loss; lse[N] saved for backward.
Status crossentropy_forward(const BlasContext& ctx, cudaStream_t s, float* loss_out, float* lse, float* workspace,
                            const float* x, const float* wte, const int32_t* targets, int64_t N, int64_t C, int64_t V);
Status crossentropy_backward(const BlasContext& ctx, cudaStream_t s, float* dx, float* dwte, float* workspace,
                             const float* x, const float* wte, const int32_t* targets, const float* lse, float dloss,
                             int64_t N, int64_t C, int64_t V);

}  // namespace strata::gpu::cuda
