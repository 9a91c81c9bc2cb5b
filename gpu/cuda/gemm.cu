// GEMMs through cuBLASLt, in fp32 with fp32 accumulation. Callers think in
// row-major (like gpu/host/ops.cpp); cuBLASLt is column-major, so a row-major
// C = op(A) op(B) is computed as the column-major C^T = op(B)^T op(A)^T.
#include <utility>

#include "gpu/cuda/cuda_check.h"
#include "gpu/cuda/ops.h"

namespace strata::gpu::cuda {

Result<BlasContext> BlasContext::create(int device) {
  STRATA_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  BlasContext ctx;
  cublasLtHandle_t h = nullptr;
  STRATA_CUBLAS_RETURN_IF_ERROR(cublasLtCreate(&h));
  ctx.handle_ = h;
  ctx.device_ = device;
  return Result<BlasContext>(std::move(ctx));
}

BlasContext::BlasContext(BlasContext&& other) noexcept { *this = std::move(other); }

BlasContext& BlasContext::operator=(BlasContext&& other) noexcept {
  if (this != &other) {
    std::swap(handle_, other.handle_);
    std::swap(device_, other.device_);
  }
  return *this;
}

BlasContext::~BlasContext() {
  if (handle_ == nullptr) return;
  // Destroyed with its device current; a failure here can only be ignored.
  int previous = -1;
  (void)cudaGetDevice(&previous);
  (void)cudaSetDevice(device_);
  (void)cublasLtDestroy(handle_);
  if (previous >= 0) (void)cudaSetDevice(previous);
}

namespace {

// Owners of the per-call cuBLASLt descriptors.
struct Descriptors {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  ~Descriptors() {
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

// Column-major C[m,n] = op(A) op(B) (+ bias[m] per column) + beta C.
Status gemm_col(const BlasContext& ctx, cudaStream_t stream, bool ta, bool tb, int64_t m, int64_t n, int64_t k,
                const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc,
                const float* bias) {
  Descriptors d;
  STRATA_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescCreate(&d.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  cublasOperation_t opa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, opb = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  STRATA_CUBLAS_RETURN_IF_ERROR(
      cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof(opa)));
  STRATA_CUBLAS_RETURN_IF_ERROR(
      cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof(opb)));
  if (bias != nullptr) {
    cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
    STRATA_CUBLAS_RETURN_IF_ERROR(
        cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
    STRATA_CUBLAS_RETURN_IF_ERROR(
        cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
  }
  STRATA_CUBLAS_RETURN_IF_ERROR(
      cublasLtMatrixLayoutCreate(&d.a, CUDA_R_32F, ta ? k : m, ta ? m : k, lda));
  STRATA_CUBLAS_RETURN_IF_ERROR(
      cublasLtMatrixLayoutCreate(&d.b, CUDA_R_32F, tb ? n : k, tb ? k : n, ldb));
  STRATA_CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&d.c, CUDA_R_32F, m, n, ldc));
  STRATA_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulPreferenceCreate(&d.pref));
  size_t workspace = 0;
  STRATA_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulPreferenceSetAttribute(
      d.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace, sizeof(workspace)));
  cublasLtMatmulHeuristicResult_t heuristic{};
  int found = 0;
  STRATA_CUBLAS_RETURN_IF_ERROR(
      cublasLtMatmulAlgoGetHeuristic(ctx.handle(), d.op, d.a, d.b, d.c, d.c, d.pref, 1, &heuristic, &found));
  if (found == 0) {
    return internal_error("cuBLASLt found no algorithm for a " + std::to_string(m) + "x" + std::to_string(n) + "x" +
                          std::to_string(k) + " fp32 GEMM");
  }
  const float alpha = 1.0f;
  STRATA_CUBLAS_RETURN_IF_ERROR(cublasLtMatmul(ctx.handle(), d.op, &alpha, A, d.a, B, d.b, &beta, C, d.c, C, d.c,
                                               &heuristic.algo, nullptr, 0, stream));
  return ok_status();
}

}  // namespace

Status gemm(const BlasContext& ctx, cudaStream_t stream, bool ta, bool tb, int64_t M, int64_t N, int64_t K,
            const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc,
            const float* bias) {
  // Row-major C[M,N] is column-major C^T[N,M] = op(B)^T[N,K] op(A)^T[K,M].
  return gemm_col(ctx, stream, tb, ta, N, M, K, B, ldb, A, lda, beta, C, ldc, bias);
}

}  // namespace strata::gpu::cuda
