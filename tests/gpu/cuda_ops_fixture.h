// The CUDA ops tests' fixture: a device, a stream, a cuBLASLt handle,
// seeded random inputs, NaN-poisoned outputs (so an element left unwritten
// shows) and the comparisons against the host's fp32 results — for fp32
// (CudaOps) and for bf16 / fp16 storage (CudaOpsLowPrecision<T>). Skips
// without a usable GPU, saying why.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <random>
#include <vector>

#include "common/dtype.h"
#include "gpu/cuda/cuda_device.h"
#include "gpu/cuda/ops.h"
#include "tests/test_util.h"

namespace strata::gpu::cuda {

using Vec = std::vector<float>;

class CudaOps : public ::testing::Test {
 protected:
  void SetUp() override {
    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess || count == 0) {
      GTEST_SKIP() << "no usable GPU: " << (err != cudaSuccess ? cudaGetErrorString(err) : "no CUDA device");
    }
    Result<std::unique_ptr<CudaDevice>> dev = CudaDevice::create({});
    ASSERT_TRUE(dev) << dev.error().to_string();
    dev_ = std::move(dev).value();
    Result<Stream> s = dev_->create_stream("test");
    ASSERT_TRUE(s);
    stream_ = *dev_->native(*s);
    handle_ = *s;
    Result<BlasContext> blas = BlasContext::create(0);
    ASSERT_TRUE(blas) << blas.error().to_string();
    blas_ = std::move(blas).value();
    rng_.seed(strata::testing::test_seed(81));
  }

  Vec random(size_t n, float scale = 1.0f) {
    std::normal_distribution<float> d(0.0f, scale);
    Vec v(n);
    for (float& x : v) x = d(rng_);
    return v;
  }

  template <class T>
  T* upload(const std::vector<T>& v) {
    Result<DeviceMemory> m = dev_->allocate(v.size() * sizeof(T) + 1, "test buffer");
    EXPECT_TRUE(m) << m.error().to_string();
    EXPECT_TRUE(dev_->copy_to_device(handle_, m->data(), v.data(), v.size() * sizeof(T)).ok());
    mem_.push_back(std::move(m).value());
    return mem_.back().as<T>();
  }

  float* poisoned(size_t n) {
    Result<DeviceMemory> m = dev_->allocate(n * 4, "poisoned output");
    EXPECT_TRUE(m);
    EXPECT_EQ(cudaMemsetAsync(m->data(), 0xFF, n * 4, stream_), cudaSuccess);  // all-ones bits: NaN
    mem_.push_back(std::move(m).value());
    return mem_.back().as<float>();
  }

  Vec download(const float* d, size_t n) {
    Vec v(n);
    EXPECT_TRUE(dev_->copy_to_host(handle_, v.data(), d, n * 4).ok());
    EXPECT_TRUE(dev_->synchronize(handle_).ok());
    return v;
  }

  // ||got - ref|| / ||ref|| < 1e-5, every element finite.
  void expect_close(const char* what, const float* got_dev, const Vec& ref) {
    Vec got = download(got_dev, ref.size());
    double diff = 0, norm = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
      ASSERT_TRUE(std::isfinite(got[i])) << what << "[" << i << "] not written or not finite";
      diff += std::pow(static_cast<double>(got[i]) - ref[i], 2);
      norm += static_cast<double>(ref[i]) * ref[i];
    }
    ASSERT_GT(norm, 0.0) << what << ": reference is all zero";
    EXPECT_LT(std::sqrt(diff / norm), 1e-5) << what;
  }

  void TearDown() override {
    mem_.clear();
  }

  std::unique_ptr<CudaDevice> dev_;
  Stream handle_;
  cudaStream_t stream_ = nullptr;
  BlasContext blas_;
  std::mt19937 rng_;
  std::vector<DeviceMemory> mem_;
};

// bf16 and fp16 ops against the host fp32 ops on the same (rounded) inputs:
// ||out - ref|| / ||ref|| < 1e-2, every output written and finite.
template <class T>
struct Half;
template <>
struct Half<__nv_bfloat16> {
  static constexpr DType kType = DType::kBF16;
};
template <>
struct Half<__half> {
  static constexpr DType kType = DType::kF16;
};

template <class T>
class CudaOpsLowPrecision : public CudaOps {
 protected:
  static constexpr DType kType = Half<T>::kType;
  static uint16_t bits(float x) { return kType == DType::kBF16 ? f32_to_bf16(x) : f32_to_f16(x); }
  static float value(uint16_t h) { return kType == DType::kBF16 ? bf16_to_f32(h) : f16_to_f32(h); }
  // Rounds v to T in place and uploads it.
  T* upload_rounded(Vec& v) {
    std::vector<uint16_t> h(v.size());
    for (size_t i = 0; i < v.size(); ++i) {
      h[i] = bits(v[i]);
      v[i] = value(h[i]);
    }
    return reinterpret_cast<T*>(upload(h));
  }
  T* poisoned_half(size_t n) { return reinterpret_cast<T*>(poisoned((n + 1) / 2)); }
  void expect_close_half(const char* what, const T* got_dev, const Vec& ref) {
    std::vector<uint16_t> h(ref.size());
    ASSERT_TRUE(dev_->copy_to_host(handle_, h.data(), got_dev, h.size() * 2).ok());
    ASSERT_TRUE(dev_->synchronize(handle_).ok());
    double diff = 0, norm = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
      float g = value(h[i]);
      ASSERT_TRUE(std::isfinite(g)) << what << "[" << i << "] not written or not finite";
      diff += std::pow(static_cast<double>(g) - ref[i], 2);
      norm += static_cast<double>(ref[i]) * ref[i];
    }
    ASSERT_GT(norm, 0.0);
    EXPECT_LT(std::sqrt(diff / norm), 1e-2) << what;
  }
};

}  // namespace strata::gpu::cuda
