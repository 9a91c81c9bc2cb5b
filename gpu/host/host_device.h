// HostDevice: the host backend as a gpu::Device. Its "device memory" is
// ordinary host memory counted against a capacity, so the engine's placement,
// prefetching and overlap run — and are tested — on machines without a GPU,
// with the same budget errors a GPU would give. Each stream is a worker
// thread running its work in order: copies are real memcpys on that thread,
// so they overlap compute submitted to another stream. enqueue() runs host
// compute (the host ops) on a stream.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "gpu/device.h"
#include "gpu/memory_budget.h"

namespace strata::gpu {

struct HostDeviceOptions {
  // capacity_bytes = kNoCap: a device limited only by the host's memory.
  static constexpr uint64_t kNoCap = ~uint64_t{0};
  uint64_t capacity_bytes = 0;   // the simulated device memory budget (> 0, or kNoCap)
  uint32_t max_streams = 8;
  uint32_t max_queued = 4096;    // tasks queued per stream; more is ResourceExhausted
  uint64_t alignment = kDeviceAllocationAlignment;  // of every allocation (like cudaMalloc's)
};

class HostDevice final : public Device {
 public:
  // Called on the stream's thread after every copy, with its direction,
  // size and wall-clock span (for traces). Set before any copy; may be empty.
  using CopyObserver = std::function<void(bool to_device, uint64_t bytes, std::chrono::steady_clock::time_point start,
                                          std::chrono::steady_clock::time_point end)>;
  void set_copy_observer(CopyObserver observer) { copy_observer_ = std::move(observer); }

  static Result<std::unique_ptr<HostDevice>> create(const HostDeviceOptions& options);
  ~HostDevice() override;

  std::string_view name() const override { return "host"; }
  uint64_t capacity_bytes() const override { return budget_.capacity_bytes(); }
  uint64_t used_bytes() const override { return budget_.used_bytes(); }
  uint64_t peak_bytes() const override { return budget_.peak_bytes(); }

  Result<DeviceMemory> allocate(uint64_t bytes, std::string_view what) override;
  Result<Stream> create_stream(std::string_view name) override;
  Result<Stream> adopt_stream(void* native) override;
  Status copy_to_device(Stream stream, void* device_dst, const void* host_src, uint64_t bytes) override;
  Status copy_to_host(Stream stream, void* host_dst, const void* device_src, uint64_t bytes) override;
  Status copy_on_device(Stream stream, void* device_dst, const void* device_src, uint64_t bytes) override;
  Result<Event> record(Stream stream) override;
  Status stream_wait(Stream stream, Event event) override;
  Status synchronize(Event event) override;
  Status synchronize(Stream stream) override;
  bool done(Event event) override;
  Status async_error() override;

  // Host memory is the device's memory: nothing to pin.
  Status pin_host(void*, uint64_t) override { return ok_status(); }
  void unpin_host(void*) override {}

  // Runs `task` on the stream's worker after everything submitted to it before.
  Status enqueue(Stream stream, std::function<Status()> task) override;

 protected:
  void release(void* data, uint64_t bytes) override;

 private:
  struct Worker;
  explicit HostDevice(const HostDeviceOptions& options);
  Result<Worker*> worker(Stream stream);
  Result<Worker*> event_worker(Event event, int64_t* seq);
  Status check_range(const void* device_ptr, uint64_t bytes, const char* what) const;
  void run(Worker* w);
  // Runs w's first queued task on the calling thread (mu_ held, released
  // while the task runs): a stream's tasks run one at a time, in order, on
  // its thread or on a thread waiting for them.
  void run_front(Worker* w, std::unique_lock<std::mutex>& lock);
  // Waits until w has completed task `seq`, running its queued tasks up to
  // it meanwhile rather than waiting for its thread to wake.
  void wait_completed(Worker* w, int64_t seq, std::unique_lock<std::mutex>& lock);

  // Events are (stream, sequence number): a stream's tasks are numbered in
  // submission order, and an event is done when its stream has completed
  // the task with that number. Nothing per event is stored.
  static constexpr int kSeqBits = 40;

  HostDeviceOptions options_;
  CopyObserver copy_observer_;
  MemoryBudget budget_;
  mutable std::mutex mu_;
  std::condition_variable cv_;  // a task completed somewhere
  std::map<uintptr_t, uint64_t> allocations_;  // start -> bytes
  Status async_error_;
  bool stopping_ = false;
  std::vector<std::unique_ptr<Worker>> workers_;
};

}  // namespace strata::gpu
