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
  int threads = 0;      // 0: every core (of the NUMA node when one is given); capped at those cores
  int numa_node = -1;   // -1: no binding (below -1: InvalidArgument)
};

class Executor {
 public:
  static Result<std::unique_ptr<Executor>> create(const ExecutorOptions& options = {});
  ~Executor();
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  int threads() const { return threads_; }
  int numa_node() const { return numa_node_; }

  // Runs body(begin, end) over [0, n) in chunks of exactly `grain` (> 0)
  // elements (the last may be shorter), in parallel inside the arena, each chunk
  // taken by the next free thread. Chunk boundaries depend only on n and
  // grain, never on the thread count.
  void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& body);

  // Touches every page of [data, data+bytes) from the executor's threads, so
  // Linux's first-touch policy places it on their NUMA node (and binds the
  // range there with hwloc when a node was given).
  Status first_touch(void* data, uint64_t bytes);

  // memset(data, 0, bytes) and memcpy(dst, src, bytes) from the executor's
  // threads, in 2 MiB pieces: a new buffer's pages fault in (and the kernel
  // clears them) on all threads at once and on their NUMA node, where one
  // thread filling a model-sized buffer spends most of its time in the
  // kernel's page-fault path.
  void zero(void* data, uint64_t bytes);
  void copy(void* dst, const void* src, uint64_t bytes);

  // While a scope lives, the pages the calling thread faults in come from
  // the executor's NUMA node (hwloc binds the thread's memory policy; the
  // previous policy comes back when the scope ends). For allocators that
  // fault memory in themselves — mlock, cudaHostAlloc — and for buffers
  // filled where they are made. Without a node it does nothing.
  class NodeMemoryScope {
   public:
    NodeMemoryScope() = default;
    NodeMemoryScope(NodeMemoryScope&& other) noexcept;
    NodeMemoryScope& operator=(NodeMemoryScope&&) = delete;
    NodeMemoryScope(const NodeMemoryScope&) = delete;
    ~NodeMemoryScope();
    bool active() const { return saved_ != nullptr; }

   private:
    friend class Executor;
    const Executor* executor_ = nullptr;
    void* saved_ = nullptr;  // hwloc_bitmap_t: the thread's nodeset before
    int saved_policy_ = 0;
  };
  Result<NodeMemoryScope> node_memory_scope() const;

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
