// The custom-model C API on a CUDA GPU, driven with the caller's own CUDA
// streams (the `void* stream` arguments). A toy model whose gradient is its
// weights, carried from its forward to its backward through an activation
// checkpoint (saved, overwritten on the device, prefetched and loaded back),
// trains the same bits three ways: on the host backend with the blocking
// calls, on the GPU with the blocking calls, and on the GPU with every call
// stream-ordered on a new stream each step (more streams than the device
// makes of its own). Weights stream through two device slots, so a copy the
// stream failed to wait for would read another chunk's bits. Needs a GPU;
// skips with the reason otherwise.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <string>
#include <vector>

#include "strata/strata.h"

namespace {

constexpr int64_t kCounts[] = {1000, 4097, 2048, 333, 1500};
constexpr int kChunks = sizeof(kCounts) / sizeof(kCounts[0]);
constexpr int kSteps = 20;  // more than CudaDeviceOptions::max_streams
constexpr int kMicroBatches = 2;

enum class Mode { kHost, kCudaBlocking, kCudaStreams };

// Where this run's bits went: every chunk's master weights after the run and
// every step's gradient norm.
struct RunBits {
  std::vector<std::vector<float>> masters;
  std::vector<double> norms;
};

#define STRATA_OK_OR_FAIL(call) ASSERT_EQ((call), STRATA_OK) << #call << ": " << strata_last_error()
#define CUDA_OK_OR_FAIL(call) ASSERT_EQ((call), cudaSuccess) << #call

float initial(int chunk, int64_t i) {
  return 0.5f * std::sin(0.37f * static_cast<float>(i) + static_cast<float>(chunk));
}

std::string config() {
  // fp32 working weights: the gradient is the weights' own bits on every
  // backend; weights and saved activations off the device, two weight slots.
  return R"({"precision": "fp32", "optimizer": {"type": "adamw", "lr": 0.01, "weight_decay": 0.01},
             "batch": {"grad_accum": 2}, "budgets": {"device": 1048576},
             "placement": {"weights": "host", "states": "host", "activations": "host"},
             "session": {"prefetch_depth": 1}})";
}

// One copy of `bytes` between two of the session's device buffers: on the
// host backend memcpy, on the GPU on `stream` (NULL: synchronously).
void copy(Mode mode, void* dst, const void* src, size_t bytes, cudaStream_t stream) {
  if (mode == Mode::kHost) {
    std::memcpy(dst, src, bytes);
    return;
  }
  ASSERT_EQ(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream), cudaSuccess);
  if (stream == nullptr) {
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  }
}

// Overwrites a buffer with NaNs (0xff bytes) once the session no longer
// reads it, so a checkpoint the session did not copy in time shows.
void scribble(Mode mode, void* dst, size_t bytes, cudaStream_t stream) {
  if (mode == Mode::kHost) {
    std::memset(dst, 0xff, bytes);
    return;
  }
  ASSERT_EQ(cudaMemsetAsync(dst, 0xff, bytes, stream), cudaSuccess);
  if (stream == nullptr) {
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  }
}

// Forward: each chunk's weights into the scratch buffer, saved as the
// chunk's checkpoint, the buffer overwritten. `s` is the stream the session
// calls take (NULL: the blocking calls).
void forward(strata_session* session, Mode mode, cudaStream_t s, void* scratch) {
  for (int c = 0; c < kChunks; ++c) {
    const size_t bytes = static_cast<size_t>(kCounts[c]) * sizeof(float);
    const void* w = nullptr;
    STRATA_OK_OR_FAIL(strata_session_acquire(session, c, s, &w));
    ASSERT_NO_FATAL_FAILURE(copy(mode, scratch, w, bytes, s));
    if (s != nullptr) {
      STRATA_OK_OR_FAIL(strata_session_save_activation_on(session, static_cast<uint64_t>(c), scratch, bytes, s));
      STRATA_OK_OR_FAIL(strata_session_activation_saved(session, static_cast<uint64_t>(c), s));
    } else {
      STRATA_OK_OR_FAIL(strata_session_save_activation(session, static_cast<uint64_t>(c), scratch, bytes));
    }
    ASSERT_NO_FATAL_FAILURE(scribble(mode, scratch, bytes, s));
    STRATA_OK_OR_FAIL(strata_session_release(session, c));  // after `s`: it was acquired on it
  }
}

// Backward, last chunk first: its checkpoint loaded (the next one's
// prefetched into the other buffer meanwhile) is the chunk's gradient.
void backward(strata_session* session, Mode mode, cudaStream_t s, void* const in[2]) {
  auto bytes = [](int c) { return static_cast<size_t>(kCounts[c]) * sizeof(float); };
  const int last = kChunks - 1;
  STRATA_OK_OR_FAIL(
      strata_session_prefetch_activation_on(session, static_cast<uint64_t>(last), in[last % 2], bytes(last), s));
  for (int c = last; c >= 0; --c) {
    STRATA_OK_OR_FAIL(strata_session_load_activation_on(session, static_cast<uint64_t>(c), in[c % 2], bytes(c), s));
    if (c > 0) {
      STRATA_OK_OR_FAIL(strata_session_prefetch_activation_on(session, static_cast<uint64_t>(c - 1), in[(c - 1) % 2],
                                                              bytes(c - 1), s));
    }
    void* g = nullptr;
    STRATA_OK_OR_FAIL(strata_session_gradient_buffer(session, c, &g));
    ASSERT_NO_FATAL_FAILURE(copy(mode, g, in[c % 2], bytes(c), s));
    STRATA_OK_OR_FAIL(strata_session_submit_gradient(session, c, s));
  }
}

void train(Mode mode, RunBits* run) {
  const char* device = mode == Mode::kHost ? "host" : "cuda";
  strata_session* session = nullptr;
  STRATA_OK_OR_FAIL(strata_session_create(config().c_str(), device, &session));
  std::vector<cudaStream_t> streams;  // kCudaStreams: one per step, all alive until the session is gone
  auto finish = [&] {
    if (session != nullptr) {
      EXPECT_EQ(strata_session_finalize(session), STRATA_OK) << strata_last_error();
      strata_session_destroy(session);
      session = nullptr;
    }
    for (cudaStream_t s : streams) EXPECT_EQ(cudaStreamDestroy(s), cudaSuccess);
    streams.clear();
  };
  struct Finally {
    decltype(finish)& f;
    ~Finally() { f(); }
  } finally{finish};

  for (int c = 0; c < kChunks; ++c) {
    std::vector<float> v(static_cast<size_t>(kCounts[c]));
    for (int64_t i = 0; i < kCounts[c]; ++i) v[static_cast<size_t>(i)] = initial(c, i);
    STRATA_OK_OR_FAIL(
        strata_session_add_chunk(session, ("chunk" + std::to_string(c)).c_str(), kCounts[c], v.data(), nullptr));
  }
  STRATA_OK_OR_FAIL(strata_session_start(session));
  const size_t largest = static_cast<size_t>(*std::max_element(std::begin(kCounts), std::end(kCounts))) * sizeof(float);
  void* scratch = nullptr;
  void* in[2] = {nullptr, nullptr};
  STRATA_OK_OR_FAIL(strata_session_device_alloc(session, largest, &scratch));
  for (void*& p : in) STRATA_OK_OR_FAIL(strata_session_device_alloc(session, largest, &p));

  for (int step = 0; step < kSteps; ++step) {
    cudaStream_t s = nullptr;
    if (mode == Mode::kCudaStreams) {
      CUDA_OK_OR_FAIL(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
      streams.push_back(s);
    }
    STRATA_OK_OR_FAIL(strata_session_begin_step(session, 1.0f / kMicroBatches));
    for (int mb = 0; mb < kMicroBatches; ++mb) {
      ASSERT_NO_FATAL_FAILURE(forward(session, mode, s, scratch));
      ASSERT_NO_FATAL_FAILURE(backward(session, mode, s, in));
    }
    strata_step_verdict verdict = STRATA_STEP_VERDICT_INIT;
    STRATA_OK_OR_FAIL(strata_session_end_step(session, &verdict));
    EXPECT_EQ(verdict.skipped, 0) << "step " << step + 1;
    run->norms.push_back(verdict.grad_norm);
  }
  if (!streams.empty()) {
    CUDA_OK_OR_FAIL(cudaStreamSynchronize(streams.back()));
  }
  STRATA_OK_OR_FAIL(strata_session_device_free(session, scratch));
  for (void* p : in) STRATA_OK_OR_FAIL(strata_session_device_free(session, p));
  for (int c = 0; c < kChunks; ++c) {
    std::vector<float> m(static_cast<size_t>(kCounts[c]));
    STRATA_OK_OR_FAIL(strata_session_read_master(session, c, m.data(), kCounts[c]));
    run->masters.push_back(std::move(m));
  }
}

// The loss 0.5 |w|^2 (the gradient is w) of the initial weights.
double initial_loss() {
  double sum = 0;
  for (int c = 0; c < kChunks; ++c) {
    for (int64_t i = 0; i < kCounts[c]; ++i) sum += 0.5 * static_cast<double>(initial(c, i)) * initial(c, i);
  }
  return sum;
}

double loss(const RunBits& run) {
  double sum = 0;
  for (const auto& v : run.masters) {
    for (float x : v) sum += 0.5 * static_cast<double>(x) * x;
  }
  return sum;
}

// The model and its calls without a GPU: on the host backend the toy
// model's loss falls and every step's gradient norm is finite, so the GPU
// test below compares bits of a run that trains.
TEST(CApiCuda, TheToyModelLearnsOnTheHostBackend) {
  RunBits host;
  ASSERT_NO_FATAL_FAILURE(train(Mode::kHost, &host));
  ASSERT_EQ(host.norms.size(), static_cast<size_t>(kSteps));
  for (double n : host.norms) EXPECT_TRUE(std::isfinite(n) && n > 0) << n;
  EXPECT_LT(loss(host), 0.9 * initial_loss());
}

TEST(CApiCuda, CallersStreamsTrainTheHostBackendsBits) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    GTEST_SKIP() << "no usable GPU: " << (err != cudaSuccess ? cudaGetErrorString(err) : "no CUDA device");
  }
  RunBits host, blocking, streamed;
  ASSERT_NO_FATAL_FAILURE(train(Mode::kHost, &host));
  ASSERT_NO_FATAL_FAILURE(train(Mode::kCudaBlocking, &blocking));
  ASSERT_NO_FATAL_FAILURE(train(Mode::kCudaStreams, &streamed));
  EXPECT_LT(loss(streamed), 0.9 * initial_loss());
  for (const RunBits* gpu : {&blocking, &streamed}) {
    const char* how = gpu == &blocking ? "blocking calls" : "stream-ordered calls";
    ASSERT_EQ(gpu->masters.size(), host.masters.size()) << how;
    for (int c = 0; c < kChunks; ++c) {
      EXPECT_EQ(std::memcmp(gpu->masters[c].data(), host.masters[c].data(), host.masters[c].size() * sizeof(float)), 0)
          << "chunk " << c << " (" << how << ")";
    }
    EXPECT_EQ(gpu->norms, host.norms) << how;
  }
}

}  // namespace
