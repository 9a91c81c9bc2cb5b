// GEMMs through cuBLASLt: fp32, bf16 or fp16 operands, fp32 accumulation. Callers think in
// row-major (like gpu/host/ops.cpp); cuBLASLt is column-major, so a row-major
// C = op(A) op(B) is computed as the column-major C^T = op(B)^T op(A)^T.
#include <type_traits>
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

template <class T>
constexpr cudaDataType_t data_type() {
  if constexpr (std::is_same_v<T, float>) {
    return CUDA_R_32F;
  } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return CUDA_R_16BF;
  } else {
    return CUDA_R_16F;
  }
}

// Column-major C[m,n] = op(A) op(B) (+ bias[m] per column) + beta C.
template <class T>
Status gemm_col(const BlasContext& ctx, cudaStream_t stream, bool ta, bool tb, int64_t m, int64_t n, int64_t k,
                const T* A, int64_t lda, const T* B, int64_t ldb, float beta, T* C, int64_t ldc, const T* bias) {
  constexpr cudaDataType_t kType = data_type<T>();
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
  STRATA_CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&d.a, kType, ta ? k : m, ta ? m : k, lda));
  STRATA_CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&d.b, kType, tb ? n : k, tb ? k : n, ldb));
  STRATA_CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&d.c, kType, m, n, ldc));
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
                          std::to_string(k) + " GEMM");
  }
  const float alpha = 1.0f;
  STRATA_CUBLAS_RETURN_IF_ERROR(cublasLtMatmul(ctx.handle(), d.op, &alpha, A, d.a, B, d.b, &beta, C, d.c, C, d.c,
                                               &heuristic.algo, nullptr, 0, stream));
  return ok_status();
}

}  // namespace

template <class T>
Status gemm(const BlasContext& ctx, cudaStream_t stream, bool ta, bool tb, int64_t M, int64_t N, int64_t K,
            const T* A, int64_t lda, const T* B, int64_t ldb, float beta, T* C, int64_t ldc, const T* bias) {
  // Row-major C[M,N] is column-major C^T[N,M] = op(B)^T[N,K] op(A)^T[K,M].
  return gemm_col(ctx, stream, tb, ta, N, M, K, B, ldb, A, lda, beta, C, ldc, bias);
}

#define STRATA_CUDA_GEMM_INSTANTIATE(T)                                                                          \
  template Status gemm<T>(const BlasContext&, cudaStream_t, bool, bool, int64_t, int64_t, int64_t, const T*,     \
                          int64_t, const T*, int64_t, float, T*, int64_t, const T*);
STRATA_CUDA_GEMM_INSTANTIATE(float)
STRATA_CUDA_GEMM_INSTANTIATE(__nv_bfloat16)
STRATA_CUDA_GEMM_INSTANTIATE(__half)

}  // namespace strata::gpu::cuda
