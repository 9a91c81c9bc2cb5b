#include "gpu/cuda/cuda_device.h"

#include <memory>
#include <mutex>
#include <string>

#include "common/log.h"
#include "common/units.h"
#include "gpu/cuda/cuda_check.h"

namespace strata::gpu::cuda {

Result<std::unique_ptr<CudaDevice>> CudaDevice::create(const CudaDeviceOptions& options) {
  if (options.event_ring == 0 || options.max_streams == 0) {
    return invalid_argument("CUDA device: event_ring and max_streams must be >= 1");
  }
  int count = 0;
  // No GPU or no driver is a capability this machine lacks, not a failure
  // of strata: Unimplemented, as the C API promises, with the driver's word.
  if (const cudaError_t err = cudaGetDeviceCount(&count); err != cudaSuccess) {
    if (err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver || err == cudaErrorNotSupported ||
        err == cudaErrorDevicesUnavailable) {
      return unimplemented(std::string("CUDA device: no usable GPU here (") + cudaGetErrorName(err) + ": " +
                           cudaGetErrorString(err) + "); run on the host backend (device \"host\")");
    }
    return cuda_status(err, "cudaGetDeviceCount(&count)");
  }
  if (count == 0) return unimplemented("CUDA device: no GPU here; run on the host backend (device \"host\")");
  if (options.device < 0 || options.device >= count) {
    return invalid_argument("CUDA device " + std::to_string(options.device) + " does not exist (" +
                            std::to_string(count) + " present)");
  }
  std::unique_ptr<CudaDevice> dev(new CudaDevice(options));
  STRATA_CUDA_RETURN_IF_ERROR(cudaSetDevice(options.device));
  cudaDeviceProp prop{};
  STRATA_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, options.device));
  dev->name_ = std::string("cuda:") + std::to_string(options.device) + " (" + prop.name + ")";
  size_t free_bytes = 0, total_bytes = 0;
  STRATA_CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free_bytes, &total_bytes));
  uint64_t available = free_bytes > options.reserve_bytes ? free_bytes - options.reserve_bytes : 0;
  const uint64_t capacity = options.capacity_bytes == 0 ? available : options.capacity_bytes;
  if (capacity > available) {
    return resource_exhausted("CUDA device budget of " + format_bytes(capacity) + " exceeds the " +
                              format_bytes(available) + " free on " + dev->name_ + " (after a " +
                              format_bytes(options.reserve_bytes) + " reserve)");
  }
  dev->budget_ = std::make_unique<MemoryBudget>(capacity, "device memory on " + dev->name_);
  dev->events_.assign(options.event_ring, nullptr);
  for (cudaEvent_t& e : dev->events_) STRATA_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  // nvcc's front end does not apply C++17's implicit move to a converting return.
  return Result<std::unique_ptr<CudaDevice>>(std::move(dev));
}

CudaDevice::~CudaDevice() {
  // Destroyed with the device current; cleanup errors are logged, and every
  // remaining resource is still released.
  if (cudaSetDevice(options_.device) != cudaSuccess) log_warning("CudaDevice shutdown: cudaSetDevice failed");
  for (size_t k = 0; k < streams_.size(); ++k) {
    if (adopted_[k]) continue;  // the caller's
    if (cudaStreamSynchronize(streams_[k]) != cudaSuccess || cudaStreamDestroy(streams_[k]) != cudaSuccess) {
      log_warning("CudaDevice shutdown: a stream reported an error");
    }
  }
  for (cudaEvent_t e : events_) {
    if (e != nullptr) (void)cudaEventDestroy(e);
  }
  if (budget_ && budget_->used_bytes() != 0) {
    log_warning("CudaDevice destroyed with " + format_bytes(budget_->used_bytes()) + " still allocated");
  }
}

Result<DeviceMemory> CudaDevice::allocate(uint64_t bytes, std::string_view what) {
  const uint64_t rounded = device_allocation_bytes(bytes);
  STRATA_RETURN_IF_ERROR(budget_->charge(rounded, what));
  void* data = nullptr;
  cudaError_t err = cudaMalloc(&data, rounded);
  if (err != cudaSuccess) {
    budget_->release(rounded);
    return cuda_status(err, "cudaMalloc").with_context(std::string(what) + " (" + format_bytes(rounded) + ")");
  }
  return DeviceMemory(this, data, rounded);
}

void CudaDevice::release(void* data, uint64_t bytes) {
  if (cudaFree(data) != cudaSuccess) log_warning("cudaFree failed for " + format_bytes(bytes));
  budget_->release(bytes);
}

Result<Stream> CudaDevice::create_stream(std::string_view name) {
  std::lock_guard lock(mu_);
  if (own_streams_ >= options_.max_streams) {
    return resource_exhausted("CUDA device: all " + std::to_string(options_.max_streams) + " streams in use (" +
                              std::string(name) + ")");
  }
  cudaStream_t s = nullptr;
  STRATA_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  streams_.push_back(s);
  adopted_.push_back(false);
  ++own_streams_;
  return Stream{static_cast<int32_t>(streams_.size() - 1)};
}

Result<Stream> CudaDevice::adopt_stream(void* native) {
  if (native == nullptr) return invalid_argument("CUDA device: adopt_stream of a null stream");
  auto s = static_cast<cudaStream_t>(native);
  std::lock_guard lock(mu_);
  for (size_t k = 0; k < streams_.size(); ++k) {
    if (streams_[k] == s) return Stream{static_cast<int32_t>(k)};
  }
  // Not counted against max_streams: the device holds nothing for it but
  // its handle (a trainer may use a new stream of its own every step).
  streams_.push_back(s);
  adopted_.push_back(true);
  return Stream{static_cast<int32_t>(streams_.size() - 1)};
}

Result<cudaStream_t> CudaDevice::native(Stream stream) const {
  std::lock_guard lock(mu_);
  if (stream.id < 0 || static_cast<size_t>(stream.id) >= streams_.size()) {
    return invalid_argument("CUDA device: unknown stream " + std::to_string(stream.id));
  }
  return streams_[static_cast<size_t>(stream.id)];
}

Status CudaDevice::copy_to_device(Stream stream, void* device_dst, const void* host_src, uint64_t bytes) {
  STRATA_ASSIGN_OR_RETURN(cudaStream_t s, native(stream));
  STRATA_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(device_dst, host_src, bytes, cudaMemcpyHostToDevice, s));
  return ok_status();
}

Status CudaDevice::copy_to_host(Stream stream, void* host_dst, const void* device_src, uint64_t bytes) {
  STRATA_ASSIGN_OR_RETURN(cudaStream_t s, native(stream));
  STRATA_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host_dst, device_src, bytes, cudaMemcpyDeviceToHost, s));
  return ok_status();
}

Status CudaDevice::copy_on_device(Stream stream, void* device_dst, const void* device_src, uint64_t bytes) {
  STRATA_ASSIGN_OR_RETURN(cudaStream_t s, native(stream));
  STRATA_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(device_dst, device_src, bytes, cudaMemcpyDeviceToDevice, s));
  return ok_status();
}

Result<Event> CudaDevice::record(Stream stream) {
  STRATA_ASSIGN_OR_RETURN(cudaStream_t s, native(stream));
  std::lock_guard lock(mu_);
  int64_t id = next_event_++;
  STRATA_CUDA_RETURN_IF_ERROR(cudaEventRecord(events_[static_cast<size_t>(id % options_.event_ring)], s));
  return Event{id};
}

Result<cudaEvent_t> CudaDevice::event_of(Event event) const {
  std::lock_guard lock(mu_);
  if (event.id < 0 || event.id >= next_event_) return invalid_argument("CUDA device: unknown event");
  if (next_event_ - event.id > static_cast<int64_t>(options_.event_ring)) return cudaEvent_t{nullptr};
  return events_[static_cast<size_t>(event.id % options_.event_ring)];
}

Status CudaDevice::stream_wait(Stream stream, Event event) {
  STRATA_ASSIGN_OR_RETURN(cudaStream_t s, native(stream));
  STRATA_ASSIGN_OR_RETURN(cudaEvent_t e, event_of(event));
  if (e == nullptr) return ok_status();
  STRATA_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(s, e, 0));
  return ok_status();
}

Status CudaDevice::synchronize(Event event) {
  STRATA_ASSIGN_OR_RETURN(cudaEvent_t e, event_of(event));
  if (e == nullptr) return ok_status();
  STRATA_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(e));
  return ok_status();
}

Status CudaDevice::synchronize(Stream stream) {
  STRATA_ASSIGN_OR_RETURN(cudaStream_t s, native(stream));
  STRATA_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(s));
  return ok_status();
}

bool CudaDevice::done(Event event) {
  Result<cudaEvent_t> e = event_of(event);
  if (!e) return false;
  return *e == nullptr || cudaEventQuery(*e) == cudaSuccess;
}

namespace {
struct HostTask {
  std::function<Status()> task;
  std::function<void(Status)> fail;
};
void CUDART_CB run_host_task(void* data) {
  std::unique_ptr<HostTask> t(static_cast<HostTask*>(data));
  Status s = t->task();
  if (!s.ok()) t->fail(std::move(s));
}
}  // namespace

Status CudaDevice::enqueue(Stream stream, std::function<Status()> task) {
  STRATA_ASSIGN_OR_RETURN(cudaStream_t s, native(stream));
  auto t = std::make_unique<HostTask>();
  t->task = std::move(task);
  t->fail = [this](Status err) {
    std::lock_guard lock(mu_);
    if (host_error_.ok()) static_cast<void>(host_error_ = std::move(err));
  };
  STRATA_CUDA_RETURN_IF_ERROR(cudaLaunchHostFunc(s, run_host_task, t.get()));
  static_cast<void>(t.release());  // run_host_task owns it now
  return ok_status();
}

Status CudaDevice::pin_host(void* data, uint64_t bytes) {
  const cudaError_t err = cudaHostRegister(data, bytes, cudaHostRegisterPortable);
  if (err == cudaErrorHostMemoryAlreadyRegistered) {
    // A page of it is pinned already (small heap blocks share pages): the
    // range stays pageable, copies from it are merely synchronous.
    static_cast<void>(cudaGetLastError());
    return ok_status();
  }
  STRATA_CUDA_RETURN_IF_ERROR(err);
  std::lock_guard lock(mu_);
  pinned_.insert(data);
  return ok_status();
}

void CudaDevice::unpin_host(void* data) {
  std::lock_guard lock(mu_);
  if (pinned_.erase(data) > 0) cudaHostUnregister(data);
}

Status CudaDevice::async_error() {
  {
    std::lock_guard lock(mu_);
    if (!host_error_.ok()) {
      Status s = std::move(host_error_);
      static_cast<void>(host_error_ = Status());
      return s;
    }
  }
  return cuda_status(cudaGetLastError(), "asynchronous CUDA work");
}

}  // namespace strata::gpu::cuda
