// CudaDevice: gpu::Device on one CUDA GPU. Memory comes from cudaMalloc and
// is counted against a budget (by default what the GPU has free at creation,
// less a reserve for the CUDA context and cuBLASLt); streams are
// non-blocking CUDA streams; events come from a fixed ring of CUDA events
// (an Event older than the ring's size counts as done). Copies are
// cudaMemcpyAsync: from pinned host memory they overlap compute.
// Every CUDA call is checked and returned as a Status.
#pragma once

#include <cuda_runtime.h>

#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <vector>

#include "gpu/device.h"
#include "gpu/memory_budget.h"

namespace strata::gpu::cuda {

struct CudaDeviceOptions {
  int device = 0;
  uint64_t capacity_bytes = 0;  // 0: free memory at creation minus reserve_bytes
  uint64_t reserve_bytes = 512ull << 20;
  uint32_t max_streams = 16;  // streams of its own; the callers' it adopts are not counted
  uint32_t event_ring = 4096;
};

class CudaDevice final : public Device {
 public:
  static Result<std::unique_ptr<CudaDevice>> create(const CudaDeviceOptions& options);
  ~CudaDevice() override;

  std::string_view name() const override { return name_; }
  uint64_t capacity_bytes() const override { return budget_->capacity_bytes(); }
  uint64_t used_bytes() const override { return budget_->used_bytes(); }
  uint64_t peak_bytes() const override { return budget_->peak_bytes(); }

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
  Status enqueue(Stream stream, std::function<Status()> task) override;
  Status pin_host(void* data, uint64_t bytes) override;
  void unpin_host(void* data) override;

  int device_index() const { return options_.device; }
  Result<cudaStream_t> native(Stream stream) const;

 protected:
  void release(void* data, uint64_t bytes) override;

 private:
  explicit CudaDevice(const CudaDeviceOptions& options) : options_(options) {}
  Result<cudaEvent_t> event_of(Event event) const;  // null when the ring overwrote it

  CudaDeviceOptions options_;
  std::string name_;
  std::unique_ptr<MemoryBudget> budget_;  // made once the capacity is known
  mutable std::mutex mu_;
  std::vector<cudaStream_t> streams_;
  std::vector<bool> adopted_;  // per stream: the caller's (adopt_stream), not destroyed here
  uint32_t own_streams_ = 0;   // made by create_stream: at most options_.max_streams
  std::vector<cudaEvent_t> events_;
  int64_t next_event_ = 0;
  Status host_error_;  // first failure of an enqueued host task, not yet reported
  std::set<void*> pinned_;  // host ranges this device registered
};

}  // namespace strata::gpu::cuda
