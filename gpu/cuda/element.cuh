// Device-side helpers the CUDA kernels share: element conversions (storage
// type T = float, __nv_bfloat16 or __half; arithmetic always in fp32, every
// store rounding to nearest even once), warp reductions, launch shapes.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "common/status.h"
#include "gpu/cuda/cuda_check.h"

namespace strata::gpu::cuda::detail {

__device__ __forceinline__ float to_f(float x) { return x; }
__device__ __forceinline__ float to_f(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_f(__half x) { return __half2float(x); }
template <class T>
__device__ __forceinline__ T from_f(float x);
template <>
__device__ __forceinline__ float from_f<float>(float x) { return x; }
template <>
__device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }
template <>
__device__ __forceinline__ __half from_f<__half>(float x) { return __float2half_rn(x); }
// dst += x, widened to fp32 for the add.
template <class T>
__device__ __forceinline__ void add_to(T* dst, float x) { *dst = from_f<T>(to_f(*dst) + x); }

// Butterfly reductions: every lane ends with the same, order-fixed result.
__device__ __forceinline__ float warp_sum(float v) {
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
  return v;
}

constexpr int kThreads = 256;

inline unsigned blocks_for(int64_t n) { return static_cast<unsigned>((n + kThreads - 1) / kThreads); }

inline Status launched(const char* what) { return cuda_status(cudaGetLastError(), what); }

}  // namespace strata::gpu::cuda::detail
