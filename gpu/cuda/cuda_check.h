// Every CUDA runtime and cuBLAS(Lt) call goes through one of these macros:
// a failure becomes a Status carrying the call's text and the error's name,
// returned to the caller — never an abort.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <string>

#include "common/status.h"

namespace strata::gpu::cuda {

inline Status cuda_status(cudaError_t err, const char* call) {
  if (err == cudaSuccess) return ok_status();
  StatusCode code = err == cudaErrorMemoryAllocation ? StatusCode::kResourceExhausted : StatusCode::kInternal;
  return Status(code, std::string(call) + ": " + cudaGetErrorName(err) + ": " + cudaGetErrorString(err));
}

inline Status cublas_status(cublasStatus_t err, const char* call) {
  if (err == CUBLAS_STATUS_SUCCESS) return ok_status();
  StatusCode code = err == CUBLAS_STATUS_ALLOC_FAILED ? StatusCode::kResourceExhausted : StatusCode::kInternal;
  return Status(code, std::string(call) + ": cuBLAS status " + std::to_string(static_cast<int>(err)));
}

}  // namespace strata::gpu::cuda

#define STRATA_CUDA_RETURN_IF_ERROR(call) STRATA_RETURN_IF_ERROR(::strata::gpu::cuda::cuda_status((call), #call))
#define STRATA_CUBLAS_RETURN_IF_ERROR(call) STRATA_RETURN_IF_ERROR(::strata::gpu::cuda::cublas_status((call), #call))
