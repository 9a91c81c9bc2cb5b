#include "common/serial_queue.h"

#include "common/thread.h"

namespace strata {

SerialQueue::SerialQueue(std::string thread_name) : name_(std::move(thread_name)) {
  worker_ = std::thread([this] { loop(); });
}

SerialQueue::~SerialQueue() {
  drain().ignore();
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  worker_.join();
}

void SerialQueue::submit(std::function<Status()> task) {
  {
    std::lock_guard lock(mu_);
    tasks_.push_back(std::move(task));
  }
  cv_.notify_all();
}

Status SerialQueue::drain() {
  std::unique_lock lock(mu_);
  cv_.wait(lock, [&] { return tasks_.empty() && !busy_; });
  Status s = std::move(error_);
  error_ = ok_status();
  return s;
}

void SerialQueue::loop() {
  name_this_thread(name_);
  std::unique_lock lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || !tasks_.empty(); });
    if (tasks_.empty()) return;  // stopping, nothing left
    std::function<Status()> task = std::move(tasks_.front());
    tasks_.pop_front();
    if (!error_.ok()) {  // dropped: it would build on the failed one
      cv_.notify_all();
      continue;
    }
    busy_ = true;
    lock.unlock();
    Status s = task();
    lock.lock();
    busy_ = false;
    if (!s.ok() && error_.ok()) error_ = std::move(s);
    cv_.notify_all();
  }
}

}  // namespace strata
