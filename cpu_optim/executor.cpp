#include "cpu_optim/executor.h"

#include <hwloc.h>
#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>
#include <tbb/task_scheduler_observer.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>

#include "common/check.h"

namespace strata::cpu_optim {
namespace {

// Pins every thread that enters the arena to a cpuset.
class BindObserver final : public tbb::task_scheduler_observer {
 public:
  BindObserver(tbb::task_arena& arena, hwloc_topology_t topo, hwloc_const_cpuset_t set)
      : tbb::task_scheduler_observer(arena), topo_(topo), set_(set) {
    observe(true);
  }
  ~BindObserver() override { observe(false); }
  void on_scheduler_entry(bool) override { hwloc_set_cpubind(topo_, set_, HWLOC_CPUBIND_THREAD); }

 private:
  hwloc_topology_t topo_;
  hwloc_const_cpuset_t set_;
};

}  // namespace

struct Executor::Impl {
  hwloc_topology_t topo = nullptr;
  hwloc_obj_t node = nullptr;
  std::unique_ptr<tbb::task_arena> arena;
  std::unique_ptr<BindObserver> observer;

  ~Impl() {
    observer.reset();
    arena.reset();
    if (topo != nullptr) hwloc_topology_destroy(topo);
  }
};

int hardware_threads() {
  long n = ::sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? static_cast<int>(n) : 1;
}

Result<std::unique_ptr<Executor>> Executor::create(const ExecutorOptions& options) {
  if (options.threads < 0 || options.threads > 4096) {
    return invalid_argument("cpu_optim executor: threads must be 0 (all) or 1..4096, got " +
                            std::to_string(options.threads));
  }
  if (options.numa_node < -1) {
    return invalid_argument("cpu_optim executor: numa_node must be -1 (no binding) or a node's index, got " +
                            std::to_string(options.numa_node));
  }
  std::unique_ptr<Executor> ex(new Executor());
  ex->impl_ = std::make_unique<Impl>();
  int threads = options.threads;
  if (options.numa_node >= 0) {
    if (hwloc_topology_init(&ex->impl_->topo) != 0 || hwloc_topology_load(ex->impl_->topo) != 0) {
      return unavailable("hwloc: cannot load the machine topology");
    }
    int nodes = hwloc_get_nbobjs_by_type(ex->impl_->topo, HWLOC_OBJ_NUMANODE);
    ex->impl_->node = hwloc_get_obj_by_type(ex->impl_->topo, HWLOC_OBJ_NUMANODE, static_cast<unsigned>(options.numa_node));
    if (ex->impl_->node == nullptr) {
      return invalid_argument("cpu_optim executor: NUMA node " + std::to_string(options.numa_node) +
                              " does not exist (this machine has " + std::to_string(nodes) + ")");
    }
    int node_cpus = hwloc_bitmap_weight(ex->impl_->node->cpuset);
    if (node_cpus <= 0) node_cpus = 1;
    // Bound to the node's cores: more threads than they are would only
    // take turns on them.
    threads = threads == 0 ? node_cpus : std::min(threads, node_cpus);
    ex->numa_node_ = options.numa_node;
  }
  if (threads == 0) threads = hardware_threads();
  // More threads than cores never helps a memory-bound kernel, and oneTBB
  // would cap the arena anyway; report the count that really runs.
  threads = std::min(threads, hardware_threads());
  ex->threads_ = threads;
  ex->impl_->arena = std::make_unique<tbb::task_arena>(threads);
  if (ex->impl_->node != nullptr) {
    ex->impl_->arena->initialize();  // the observer attaches to a live arena
    ex->impl_->observer =
        std::make_unique<BindObserver>(*ex->impl_->arena, ex->impl_->topo, ex->impl_->node->cpuset);
  }
  return ex;
}

Executor::~Executor() = default;

void Executor::parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& body) {
  STRATA_CHECK_MSG(grain > 0, "Executor::parallel_for: grain must be > 0, got %lld", static_cast<long long>(grain));
  if (n <= 0) return;
  int64_t chunks = (n + grain - 1) / grain;
  // Inline on the calling thread when that changes nothing; with a NUMA
  // node the work goes through the arena even then, whose observer binds
  // every thread that runs in it to the node's cores.
  if ((chunks == 1 || threads_ == 1) && impl_->node == nullptr) {
    for (int64_t c = 0; c < chunks; ++c) body(c * grain, std::min(n, (c + 1) * grain));
    return;
  }
  // One task per chunk, taken by whichever thread is free (work stealing),
  // not a fixed share per thread: a core that runs slower — a neighbour on
  // a shared host, the trainer's own threads — then does fewer chunks
  // instead of holding up the rest (bench/results/cpu_optim_revisions.md, "Ninth revision").
  // Which thread runs a chunk changes no result.
  impl_->arena->execute([&] {
    tbb::parallel_for(
        tbb::blocked_range<int64_t>(0, chunks, 1),
        [&](const tbb::blocked_range<int64_t>& r) {
          for (int64_t c = r.begin(); c != r.end(); ++c) body(c * grain, std::min(n, (c + 1) * grain));
        },
        tbb::simple_partitioner());
  });
}

Status Executor::first_touch(void* data, uint64_t bytes) {
  if (bytes == 0) return ok_status();
  if (impl_->node != nullptr &&
      hwloc_set_area_membind(impl_->topo, data, bytes, impl_->node->nodeset, HWLOC_MEMBIND_BIND,
                             HWLOC_MEMBIND_BYNODESET) != 0) {
    return unavailable("hwloc: cannot bind " + std::to_string(bytes) + " bytes to NUMA node " +
                       std::to_string(numa_node_) + ": " + std::strerror(errno));
  }
  constexpr int64_t kPage = 4096;
  auto* bytes_ptr = static_cast<unsigned char*>(data);
  int64_t pages = static_cast<int64_t>((bytes + kPage - 1) / kPage);
  parallel_for(pages, 256, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      // A write of the byte's own value faults the page in without changing data.
      volatile unsigned char* b = bytes_ptr + p * kPage;
      *b = *b;
    }
  });
  return ok_status();
}

namespace {
constexpr int64_t kFillPiece = int64_t{1} << 21;
}  // namespace

void Executor::zero(void* data, uint64_t bytes) {
  auto* d = static_cast<unsigned char*>(data);
  parallel_for(static_cast<int64_t>(bytes), kFillPiece,
               [d](int64_t begin, int64_t end) { std::memset(d + begin, 0, static_cast<size_t>(end - begin)); });
}

void Executor::copy(void* dst, const void* src, uint64_t bytes) {
  auto* d = static_cast<unsigned char*>(dst);
  const auto* s = static_cast<const unsigned char*>(src);
  parallel_for(static_cast<int64_t>(bytes), kFillPiece, [d, s](int64_t begin, int64_t end) {
    std::memcpy(d + begin, s + begin, static_cast<size_t>(end - begin));
  });
}

Result<Executor::NodeMemoryScope> Executor::node_memory_scope() const {
  NodeMemoryScope scope;
  if (impl_->node == nullptr) return scope;
  hwloc_bitmap_t saved = hwloc_bitmap_alloc();
  hwloc_membind_policy_t policy = HWLOC_MEMBIND_DEFAULT;
  if (hwloc_get_membind(impl_->topo, saved, &policy, HWLOC_MEMBIND_THREAD | HWLOC_MEMBIND_BYNODESET) != 0) {
    hwloc_bitmap_free(saved);
    return unavailable(std::string("hwloc: cannot read this thread's memory policy: ") + std::strerror(errno));
  }
  if (hwloc_set_membind(impl_->topo, impl_->node->nodeset, HWLOC_MEMBIND_BIND,
                        HWLOC_MEMBIND_THREAD | HWLOC_MEMBIND_BYNODESET) != 0) {
    hwloc_bitmap_free(saved);
    return unavailable("hwloc: cannot bind this thread's memory to NUMA node " + std::to_string(numa_node_) + ": " +
                       std::strerror(errno));
  }
  scope.executor_ = this;
  scope.saved_ = saved;
  scope.saved_policy_ = static_cast<int>(policy);
  return scope;
}

Executor::NodeMemoryScope::NodeMemoryScope(NodeMemoryScope&& other) noexcept
    : executor_(other.executor_), saved_(other.saved_), saved_policy_(other.saved_policy_) {
  other.saved_ = nullptr;
}

Executor::NodeMemoryScope::~NodeMemoryScope() {
  if (saved_ == nullptr) return;
  auto* saved = static_cast<hwloc_bitmap_t>(saved_);
  const auto policy = static_cast<hwloc_membind_policy_t>(saved_policy_);
  hwloc_topology_t topo = executor_->impl_->topo;
  if (policy == HWLOC_MEMBIND_DEFAULT || hwloc_bitmap_iszero(saved)) {
    hwloc_set_membind(topo, hwloc_topology_get_complete_nodeset(topo), HWLOC_MEMBIND_DEFAULT,
                      HWLOC_MEMBIND_THREAD | HWLOC_MEMBIND_BYNODESET);
  } else {
    hwloc_set_membind(topo, saved, policy, HWLOC_MEMBIND_THREAD | HWLOC_MEMBIND_BYNODESET);
  }
  hwloc_bitmap_free(saved);
}

}  // namespace strata::cpu_optim
