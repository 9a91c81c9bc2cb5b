// Executor: the threads cpu_optim runs on — a oneTBB task_arena with a fixed
// thread count, optionally pinned (hwloc) to the cores of one NUMA node, plus
// first-touch placement of buffers on that node. No global state: each
// Executor owns its arena; callers may keep one per NUMA node.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

#include "common/status.h"

namespace strata::cpu_optim {

struct ExecutorOptions {
  int threads = 0;      // 0: every core (of the NUMA node when one is given); capped at the cores online
  int numa_node = -1;   // -1: no binding
};

class Executor {
 public:
  static Result<std::unique_ptr<Executor>> create(const ExecutorOptions& options = {});
  ~Executor();
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  int threads() const { return threads_; }
  int numa_node() const { return numa_node_; }

  // Runs body(begin, end) over [0, n) in chunks of exactly `grain` elements
  // (the last may be shorter), in parallel inside the arena. Chunk boundaries
  // depend only on n and grain, never on the thread count.
  void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& body);

  // Touches every page of [data, data+bytes) from the executor's threads, so
  // Linux's first-touch policy places it on their NUMA node (and binds the
  // range there with hwloc when a node was given).
  Status first_touch(void* data, uint64_t bytes);

 private:
  struct Impl;
  Executor() = default;
  std::unique_ptr<Impl> impl_;
  int threads_ = 1;
  int numa_node_ = -1;
};

// Cores online, for defaults and reports.
int hardware_threads();

}  // namespace strata::cpu_optim
