#include "gpu/host/host_device.h"

#include <cstdlib>
#include <cstring>

#include "common/thread.h"
#include "common/units.h"

namespace strata::gpu {

struct HostDevice::Worker {
  int32_t id = 0;
  std::string name;
  std::deque<std::pair<int64_t, std::function<Status()>>> queue;  // (seq, task)
  int64_t submitted = 0;
  int64_t completed = 0;
  bool running = false;          // one of its tasks is running (on its thread or a waiter's)
  std::condition_variable wake;  // its thread's: a task queued, or stopping
  std::thread thread;
};

HostDevice::HostDevice(const HostDeviceOptions& options)
    : options_(options), budget_(options.capacity_bytes, "device memory") {}

Result<std::unique_ptr<HostDevice>> HostDevice::create(const HostDeviceOptions& options) {
  if (options.capacity_bytes == 0) return invalid_argument("host device: capacity_bytes must be > 0");
  if (!is_power_of_two(options.alignment) || options.alignment < 64) {
    return invalid_argument("host device: alignment must be a power of two >= 64");
  }
  if (options.max_streams == 0 || options.max_queued == 0) {
    return invalid_argument("host device: max_streams and max_queued must be >= 1");
  }
  return std::unique_ptr<HostDevice>(new HostDevice(options));
}

HostDevice::~HostDevice() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  for (auto& w : workers_) w->wake.notify_all();
  for (auto& w : workers_) w->thread.join();
  STRATA_CHECK_MSG(allocations_.empty(), "host device destroyed with %zu allocations alive", allocations_.size());
}

Result<DeviceMemory> HostDevice::allocate(uint64_t bytes, std::string_view what) {
  uint64_t rounded = round_up(bytes == 0 ? 1 : bytes, options_.alignment);
  STRATA_RETURN_IF_ERROR(budget_.charge(rounded, what));
  void* data = std::aligned_alloc(options_.alignment, rounded);
  if (data == nullptr) {
    budget_.release(rounded);
    return resource_exhausted("host device: out of host memory allocating " + format_bytes(rounded) + " for " +
                              std::string(what));
  }
  {
    std::lock_guard lock(mu_);
    allocations_[reinterpret_cast<uintptr_t>(data)] = rounded;
  }
  return DeviceMemory(this, data, rounded);
}

void HostDevice::release(void* data, uint64_t bytes) {
  {
    std::lock_guard lock(mu_);
    auto it = allocations_.find(reinterpret_cast<uintptr_t>(data));
    STRATA_CHECK_MSG(it != allocations_.end() && it->second == bytes, "freeing memory this device did not allocate");
    allocations_.erase(it);
  }
  budget_.release(bytes);
  std::free(data);
}

Status HostDevice::check_range(const void* device_ptr, uint64_t bytes, const char* what) const {
  std::lock_guard lock(mu_);
  auto p = reinterpret_cast<uintptr_t>(device_ptr);
  auto it = allocations_.upper_bound(p);
  if (it != allocations_.begin()) {
    --it;
    if (p >= it->first && p + bytes <= it->first + it->second) return ok_status();
  }
  return invalid_argument(std::string(what) + ": " + std::to_string(bytes) +
                          " bytes are not inside one allocation of this device");
}

Result<Stream> HostDevice::adopt_stream(void* native) {
  (void)native;
  return unimplemented("host device: has no native streams to adopt; pass none (NULL) and the call waits instead");
}

Result<Stream> HostDevice::create_stream(std::string_view name) {
  std::lock_guard lock(mu_);
  if (workers_.size() >= options_.max_streams) {
    return resource_exhausted("host device: all " + std::to_string(options_.max_streams) + " streams in use");
  }
  auto w = std::make_unique<Worker>();
  w->id = static_cast<int32_t>(workers_.size());
  w->name = std::string(name);
  Worker* raw = w.get();
  w->thread = std::thread([this, raw] { run(raw); });
  workers_.push_back(std::move(w));
  return Stream{raw->id};
}

Result<HostDevice::Worker*> HostDevice::worker(Stream stream) {
  std::lock_guard lock(mu_);
  if (stream.id < 0 || static_cast<size_t>(stream.id) >= workers_.size()) {
    return invalid_argument("host device: unknown stream " + std::to_string(stream.id));
  }
  return workers_[static_cast<size_t>(stream.id)].get();
}

void HostDevice::run(Worker* w) {
  name_this_thread("strata:" + w->name);
  std::unique_lock lock(mu_);
  for (;;) {
    w->wake.wait(lock, [&] { return (!w->queue.empty() && !w->running) || (stopping_ && w->queue.empty()); });
    if (w->queue.empty()) return;  // stopping, and everything submitted ran
    run_front(w, lock);
  }
}

void HostDevice::run_front(Worker* w, std::unique_lock<std::mutex>& lock) {
  auto [seq, task] = std::move(w->queue.front());
  w->queue.pop_front();
  w->running = true;
  lock.unlock();
  Status status = task();
  lock.lock();
  w->running = false;
  if (!status.ok() && async_error_.ok()) {
    async_error_ = std::move(status).with_context("stream '" + w->name + "'");
  }
  w->completed = seq;
  cv_.notify_all();
  if (!w->queue.empty()) w->wake.notify_one();
}

void HostDevice::wait_completed(Worker* w, int64_t seq, std::unique_lock<std::mutex>& lock) {
  while (w->completed < seq) {
    if (!w->running && !w->queue.empty() && w->queue.front().first <= seq) {
      run_front(w, lock);
    } else {
      cv_.wait(lock);
    }
  }
}

Status HostDevice::enqueue(Stream stream, std::function<Status()> task) {
  STRATA_ASSIGN_OR_RETURN(Worker * w, worker(stream));
  {
    std::lock_guard lock(mu_);
    if (w->queue.size() >= options_.max_queued) {
      return resource_exhausted("host device: stream '" + w->name + "' has " + std::to_string(options_.max_queued) +
                                " tasks queued (the maximum)");
    }
    w->queue.emplace_back(++w->submitted, std::move(task));
  }
  w->wake.notify_one();
  return ok_status();
}

Status HostDevice::copy_to_device(Stream stream, void* device_dst, const void* host_src, uint64_t bytes) {
  STRATA_RETURN_IF_ERROR(check_range(device_dst, bytes, "copy to device"));
  return enqueue(stream, [=, this] {
    const auto start = std::chrono::steady_clock::now();
    std::memcpy(device_dst, host_src, bytes);
    if (copy_observer_) copy_observer_(true, bytes, start, std::chrono::steady_clock::now());
    return ok_status();
  });
}

Status HostDevice::copy_to_host(Stream stream, void* host_dst, const void* device_src, uint64_t bytes) {
  STRATA_RETURN_IF_ERROR(check_range(device_src, bytes, "copy to host"));
  return enqueue(stream, [=, this] {
    const auto start = std::chrono::steady_clock::now();
    std::memcpy(host_dst, device_src, bytes);
    if (copy_observer_) copy_observer_(false, bytes, start, std::chrono::steady_clock::now());
    return ok_status();
  });
}

Status HostDevice::copy_on_device(Stream stream, void* device_dst, const void* device_src, uint64_t bytes) {
  STRATA_RETURN_IF_ERROR(check_range(device_dst, bytes, "copy on device"));
  STRATA_RETURN_IF_ERROR(check_range(device_src, bytes, "copy on device"));
  return enqueue(stream, [=] {
    std::memmove(device_dst, device_src, bytes);
    return ok_status();
  });
}

Result<Event> HostDevice::record(Stream stream) {
  STRATA_RETURN_IF_ERROR(enqueue(stream, [] { return ok_status(); }));
  std::lock_guard lock(mu_);
  const Worker& w = *workers_[static_cast<size_t>(stream.id)];
  return Event{(static_cast<int64_t>(w.id) << kSeqBits) | w.submitted};
}

Result<HostDevice::Worker*> HostDevice::event_worker(Event event, int64_t* seq) {
  if (event.id < 0) return invalid_argument("host device: invalid event");
  *seq = event.id & ((int64_t{1} << kSeqBits) - 1);
  return worker(Stream{static_cast<int32_t>(event.id >> kSeqBits)});
}

Status HostDevice::stream_wait(Stream stream, Event event) {
  int64_t seq = 0;
  STRATA_ASSIGN_OR_RETURN(Worker * source, event_worker(event, &seq));
  if (source->id == stream.id) return ok_status();  // a stream is already ordered after its own events
  return enqueue(stream, [this, source, seq] {
    std::unique_lock lock(mu_);
    wait_completed(source, seq, lock);
    return ok_status();
  });
}

bool HostDevice::done(Event event) {
  int64_t seq = 0;
  Result<Worker*> w = event_worker(event, &seq);
  if (!w) return false;
  std::lock_guard lock(mu_);
  return (*w)->completed >= seq;
}

Status HostDevice::synchronize(Event event) {
  int64_t seq = 0;
  STRATA_ASSIGN_OR_RETURN(Worker * w, event_worker(event, &seq));
  std::unique_lock lock(mu_);
  wait_completed(w, seq, lock);
  return ok_status();
}

Status HostDevice::synchronize(Stream stream) {
  // Waits for the last task submitted so far; needs no queue slot, so it
  // works on a full queue.
  STRATA_ASSIGN_OR_RETURN(Worker * w, worker(stream));
  std::unique_lock lock(mu_);
  const int64_t seq = w->submitted;
  wait_completed(w, seq, lock);
  return ok_status();
}

Status HostDevice::async_error() {
  std::lock_guard lock(mu_);
  Status s = std::move(async_error_);
  async_error_ = Status();
  return s;
}

}  // namespace strata::gpu
