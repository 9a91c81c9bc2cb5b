// SerialQueue: one worker thread that runs the tasks it is given, in the
// order given, beside the caller. drain() waits until every task so far has
// run and returns the first error among them; after an error the tasks
// still queued behind it are dropped (each would build on the failed one).
// The destructor drains. submit() and drain() belong to one thread.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "common/status.h"

namespace strata {

class SerialQueue {
 public:
  explicit SerialQueue(std::string thread_name);
  ~SerialQueue();
  SerialQueue(const SerialQueue&) = delete;
  SerialQueue& operator=(const SerialQueue&) = delete;

  void submit(std::function<Status()> task);
  Status drain();

 private:
  void loop();
  std::string name_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<Status()>> tasks_;  // guarded by mu_
  bool busy_ = false;                          // a task is running; guarded by mu_
  bool stop_ = false;                          // guarded by mu_
  Status error_;                               // the first failure since the last drain; guarded by mu_
  std::thread worker_;
};

}  // namespace strata
