// One door to every compute backend: the engine names a backend by value
// and never includes a backend's header or tests a build flag. make_device
// builds the host backend (the CPU, optionally capped like a GPU) or the
// first CUDA GPU; the pinned-host calls give page-locked memory that a
// backend's copies run asynchronously from. A backend this build lacks is
// Unimplemented, saying so.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>

#include "common/dtype.h"
#include "common/status.h"
#include "gpu/device.h"

namespace strata::gpu {

enum class Backend : uint8_t { kHost, kCuda };

// Called after every host<->device copy with its direction, size and
// wall-clock span (the host backend's, for traces).
using CopyObserver = std::function<void(bool to_device, uint64_t bytes, std::chrono::steady_clock::time_point start,
                                        std::chrono::steady_clock::time_point end)>;

struct DeviceSpec {
  Backend backend = Backend::kHost;
  // The device's memory budget. 0: the host backend uncapped (counted,
  // never refused); a GPU's free memory less a reserve.
  uint64_t capacity_bytes = 0;
  // The host backend's compute cores (0: all of them).
  int compute_threads = 0;
  // The host backend reports its copies here (may be empty); a GPU's
  // copies are seen in its own profilers instead.
  CopyObserver copy_observer;
};

// Whether this binary contains `backend`.
bool backend_built(Backend backend);

// The device. Unimplemented for a backend not built, or CUDA with no GPU;
// ResourceExhausted for a budget beyond the device's memory.
Result<std::unique_ptr<Device>> make_device(const DeviceSpec& spec);

// Page-locked host memory that `backend`'s copies run asynchronously from
// (cudaHostAlloc on CUDA), zeroed, aligned to 4096; free it with
// free_pinned_host of the same backend. The host backend needs none of its
// own (its copies are memcpy): Unimplemented there, and the caller locks
// ordinary memory if it wants it resident.
Result<void*> allocate_pinned_host(Backend backend, uint64_t bytes);
void free_pinned_host(Backend backend, void* memory);

}  // namespace strata::gpu
