// gpu::Device: memory within a byte budget, streams, events and async
// host<->device copies — the part of a compute backend the engine's
// scheduler drives. A model's compute on it is the model's (the built-in
// GPT's: models/gpt/gpt_ops.h), from the backend's single ops.
//
// Rules every backend keeps:
// - allocate() beyond the budget is ResourceExhausted naming the budget, the
//   request and what is in use — never a silent fallback to other memory;
// - work on one stream runs in submission order; different streams may run
//   concurrently; an Event marks a point in a stream's order;
// - a copy's buffers stay valid and untouched until an event recorded after
//   it has completed.
// A Device is driven by one thread at a time (the engine's scheduler).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "common/status.h"
#include "common/units.h"

namespace strata::gpu {

class Device;

// Owns one device allocation; frees it on destruction. Move-only.
class DeviceMemory {
 public:
  DeviceMemory() = default;
  DeviceMemory(Device* device, void* data, uint64_t bytes) : device_(device), data_(data), bytes_(bytes) {}
  DeviceMemory(DeviceMemory&& other) noexcept;
  DeviceMemory& operator=(DeviceMemory&& other) noexcept;
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;
  ~DeviceMemory();

  void* data() const { return data_; }
  uint64_t bytes() const { return bytes_; }
  template <class T>
  T* as() const {
    return static_cast<T*>(data_);
  }

 private:
  void reset();
  Device* device_ = nullptr;
  void* data_ = nullptr;
  uint64_t bytes_ = 0;
};

// Opaque handles; a backend keeps the state behind the id.
struct Stream {
  int32_t id = -1;
};
struct Event {
  int64_t id = -1;
};

// Every allocation takes whole units of this many bytes (cudaMalloc's
// granularity, and the host backend's default alignment): what a budget is
// charged for `bytes`, and what a planner counts.
inline constexpr uint64_t kDeviceAllocationAlignment = 256;
inline constexpr uint64_t device_allocation_bytes(uint64_t bytes) {
  return round_up(bytes == 0 ? 1 : bytes, kDeviceAllocationAlignment);
}

class Device {
 public:
  virtual ~Device() = default;

  virtual std::string_view name() const = 0;
  virtual uint64_t capacity_bytes() const = 0;
  virtual uint64_t used_bytes() const = 0;
  virtual uint64_t peak_bytes() const = 0;  // high-water mark of used_bytes()

  // `what` names the allocation in errors ("block 7 weights").
  virtual Result<DeviceMemory> allocate(uint64_t bytes, std::string_view what) = 0;

  virtual Result<Stream> create_stream(std::string_view name) = 0;
  // A stream of the caller's (CUDA: a cudaStream_t, not owned: it must
  // outlive the device's use of it) as a Stream of this device; the same
  // native stream gives the same Stream. Any number of them: the device
  // keeps only the handle. Unimplemented on a backend without native
  // streams (the host's).
  virtual Result<Stream> adopt_stream(void* native) = 0;
  virtual Status copy_to_device(Stream stream, void* device_dst, const void* host_src, uint64_t bytes) = 0;
  virtual Status copy_to_host(Stream stream, void* host_dst, const void* device_src, uint64_t bytes) = 0;
  // Device memory to device memory (a model's own buffer into one the engine hands out).
  virtual Status copy_on_device(Stream stream, void* device_dst, const void* device_src, uint64_t bytes) = 0;

  virtual Result<Event> record(Stream stream) = 0;
  // Later work on `stream` waits for `event`.
  virtual Status stream_wait(Stream stream, Event event) = 0;
  // The calling thread waits for `event` / for everything submitted to `stream`.
  virtual Status synchronize(Event event) = 0;
  virtual Status synchronize(Stream stream) = 0;
  virtual bool done(Event event) = 0;

  // First error of background work not yet reported (an async copy that
  // failed, a task that threw); cleared by reading. OK when none.
  virtual Status async_error() = 0;

  // Pins `bytes` of host memory at `data` so copies from and to it run
  // asynchronously (CUDA: cudaHostRegister; the host backend has nothing to
  // do), until unpin_host(data). Use HostPin.
  virtual Status pin_host(void* data, uint64_t bytes) = 0;
  virtual void unpin_host(void* data) = 0;

  // Runs `task` on the host after everything submitted to `stream` before
  // it, and before what comes after (CUDA: cudaLaunchHostFunc, so the task
  // must not call CUDA). A task's error becomes the device's async_error().
  virtual Status enqueue(Stream stream, std::function<Status()> task) = 0;

 protected:
  friend class DeviceMemory;
  virtual void release(void* data, uint64_t bytes) = 0;
};

// Keeps a range of host memory pinned for a device while it lives. Move-only.
class HostPin {
 public:
  HostPin() = default;
  static Result<HostPin> make(Device& device, void* data, uint64_t bytes) {
    if (data == nullptr || bytes == 0) return HostPin();
    STRATA_RETURN_IF_ERROR(device.pin_host(data, bytes));
    HostPin p;
    p.device_ = &device;
    p.data_ = data;
    return Result<HostPin>(std::move(p));
  }
  HostPin(HostPin&& other) noexcept : device_(other.device_), data_(other.data_) { other.device_ = nullptr; }
  HostPin& operator=(HostPin&& other) noexcept {
    if (this != &other) {
      reset();
      device_ = other.device_;
      data_ = other.data_;
      other.device_ = nullptr;
    }
    return *this;
  }
  HostPin(const HostPin&) = delete;
  HostPin& operator=(const HostPin&) = delete;
  ~HostPin() { reset(); }

 private:
  void reset() {
    if (device_ != nullptr) device_->unpin_host(data_);
    device_ = nullptr;
  }
  Device* device_ = nullptr;
  void* data_ = nullptr;
};

inline DeviceMemory::DeviceMemory(DeviceMemory&& other) noexcept { *this = std::move(other); }

inline DeviceMemory& DeviceMemory::operator=(DeviceMemory&& other) noexcept {
  if (this != &other) {
    reset();
    device_ = other.device_;
    data_ = other.data_;
    bytes_ = other.bytes_;
    other.device_ = nullptr;
    other.data_ = nullptr;
    other.bytes_ = 0;
  }
  return *this;
}

inline DeviceMemory::~DeviceMemory() { reset(); }

inline void DeviceMemory::reset() {
  if (device_ != nullptr && data_ != nullptr) device_->release(data_, bytes_);
  device_ = nullptr;
  data_ = nullptr;
  bytes_ = 0;
}

}  // namespace strata::gpu
