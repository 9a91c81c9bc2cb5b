// The executor's NUMA placement: asked for a node, its threads run on that
// node's cores and first_touch binds a buffer's pages there (checked with
// hwloc's own view of the threads and the pages); a node that does not exist
// is a clear error; binding never changes the optimizer's bits; a chunk goes
// to whichever thread is free.
#include "cpu_optim/executor.h"

#include <gtest/gtest.h>
#include <hwloc.h>
#include <tbb/info.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <random>
#include <vector>

#include "cpu_optim/optimizer.h"

namespace strata::cpu_optim {
namespace {

struct Topology {
  Topology() {
    ok = hwloc_topology_init(&topo) == 0 && hwloc_topology_load(topo) == 0;
  }
  ~Topology() { hwloc_topology_destroy(topo); }
  hwloc_topology_t topo = nullptr;
  bool ok = false;
};

TEST(Executor, RunsOnTheCoresAndPlacesPagesOnTheNodeAskedFor) {
  Topology t;
  ASSERT_TRUE(t.ok);
  hwloc_obj_t node = hwloc_get_obj_by_type(t.topo, HWLOC_OBJ_NUMANODE, 0);
  ASSERT_NE(node, nullptr) << "hwloc always reports at least one NUMA node";
  Result<std::unique_ptr<Executor>> ex = Executor::create({.threads = 2, .numa_node = 0});
  if (!ex && ex.error().code() == StatusCode::kUnavailable) {
    GTEST_SKIP() << "this machine refuses NUMA binding: " << ex.error().to_string();
  }
  ASSERT_TRUE(ex) << ex.error().to_string();
  EXPECT_EQ((*ex)->numa_node(), 0);
  // As many threads as asked for, at most the node's cores; 0 is all of them.
  const int node_cpus = hwloc_bitmap_weight(node->cpuset);
  EXPECT_EQ((*ex)->threads(), std::min(2, node_cpus));
  for (int asked_for : {0, 4096}) {
    Result<std::unique_ptr<Executor>> all = Executor::create({.threads = asked_for, .numa_node = 0});
    ASSERT_TRUE(all) << all.error().to_string();
    EXPECT_EQ((*all)->threads(), node_cpus) << "asked for " << asked_for;
  }

  // Every chunk of work runs on a thread bound within the node's cores.
  std::mutex mu;
  int outside = 0, asked = 0;
  (*ex)->parallel_for(64, 1, [&](int64_t, int64_t) {
    hwloc_bitmap_t set = hwloc_bitmap_alloc();
    const bool got = hwloc_get_cpubind(t.topo, set, HWLOC_CPUBIND_THREAD) == 0;
    std::lock_guard lock(mu);
    ++asked;
    if (!got || !hwloc_bitmap_isincluded(set, node->cpuset)) ++outside;
    hwloc_bitmap_free(set);
  });
  EXPECT_EQ(asked, 64);
  EXPECT_EQ(outside, 0) << "chunks ran on threads not bound to node 0's cores";
  // One thread, one chunk: still bound (not run inline on an unbound caller).
  Result<std::unique_ptr<Executor>> one = Executor::create({.threads = 1, .numa_node = 0});
  ASSERT_TRUE(one) << one.error().to_string();
  bool one_bound = false;
  (*one)->parallel_for(1, 1, [&](int64_t, int64_t) {
    hwloc_bitmap_t set = hwloc_bitmap_alloc();
    one_bound = hwloc_get_cpubind(t.topo, set, HWLOC_CPUBIND_THREAD) == 0 && hwloc_bitmap_isincluded(set, node->cpuset);
    hwloc_bitmap_free(set);
  });
  EXPECT_TRUE(one_bound) << "a one-thread executor ran its chunk on a thread not bound to node 0";

  // first_touch binds the range to the node and faults its pages in there.
  constexpr size_t kBytes = 64 * 4096;
  void* buffer = std::aligned_alloc(4096, kBytes);
  ASSERT_NE(buffer, nullptr);
  std::memset(buffer, 0x5a, 100);  // some content, kept
  Status s = (*ex)->first_touch(buffer, kBytes);
  if (!s.ok() && s.code() == StatusCode::kUnavailable) {
    std::free(buffer);
    GTEST_SKIP() << "this machine refuses memory binding: " << s.to_string();
  }
  ASSERT_TRUE(s.ok()) << s.to_string();
  EXPECT_EQ(static_cast<unsigned char*>(buffer)[99], 0x5a) << "first_touch changed the data";
  hwloc_bitmap_t bound = hwloc_bitmap_alloc(), where = hwloc_bitmap_alloc();
  hwloc_membind_policy_t policy{};
  ASSERT_EQ(hwloc_get_area_membind(t.topo, buffer, kBytes, bound, &policy, HWLOC_MEMBIND_BYNODESET), 0);
  EXPECT_EQ(policy, HWLOC_MEMBIND_BIND);
  EXPECT_TRUE(hwloc_bitmap_isequal(bound, node->nodeset)) << "the range is not bound to node 0";
  if (hwloc_get_area_memlocation(t.topo, buffer, kBytes, where, HWLOC_MEMBIND_BYNODESET) == 0) {
    EXPECT_TRUE(hwloc_bitmap_isincluded(where, node->nodeset)) << "pages lie outside node 0";
  }
  hwloc_bitmap_free(bound);
  hwloc_bitmap_free(where);
  std::free(buffer);
}

TEST(Executor, ANodeMemoryScopeBindsTheThreadsPagesAndRestoresThePolicy) {
  Topology t;
  ASSERT_TRUE(t.ok);
  hwloc_obj_t node = hwloc_get_obj_by_type(t.topo, HWLOC_OBJ_NUMANODE, 0);
  ASSERT_NE(node, nullptr);
  auto thread_policy = [&](hwloc_bitmap_t set) {
    hwloc_membind_policy_t policy{};
    EXPECT_EQ(hwloc_get_membind(t.topo, set, &policy, HWLOC_MEMBIND_THREAD | HWLOC_MEMBIND_BYNODESET), 0);
    return policy;
  };
  hwloc_bitmap_t set = hwloc_bitmap_alloc();
  const hwloc_membind_policy_t before = thread_policy(set);
  Result<std::unique_ptr<Executor>> unbound = Executor::create({.threads = 1});
  ASSERT_TRUE(unbound);
  {
    Result<Executor::NodeMemoryScope> none = (*unbound)->node_memory_scope();
    ASSERT_TRUE(none);
    EXPECT_FALSE(none->active()) << "an executor without a node changes nothing";
    EXPECT_EQ(thread_policy(set), before);
  }
  Result<std::unique_ptr<Executor>> ex = Executor::create({.threads = 1, .numa_node = 0});
  if (!ex && ex.error().code() == StatusCode::kUnavailable) {
    hwloc_bitmap_free(set);
    GTEST_SKIP() << "this machine refuses NUMA binding: " << ex.error().to_string();
  }
  ASSERT_TRUE(ex) << ex.error().to_string();
  {
    Result<Executor::NodeMemoryScope> scope = (*ex)->node_memory_scope();
    if (!scope) {
      hwloc_bitmap_free(set);
      GTEST_SKIP() << "this machine refuses memory binding: " << scope.error().to_string();
    }
    EXPECT_TRUE(scope->active());
    EXPECT_EQ(thread_policy(set), HWLOC_MEMBIND_BIND);
    EXPECT_TRUE(hwloc_bitmap_isequal(set, node->nodeset));
    Executor::NodeMemoryScope moved(std::move(*scope));  // the scope moves; it ends once
    EXPECT_EQ(thread_policy(set), HWLOC_MEMBIND_BIND);
  }
  EXPECT_EQ(thread_policy(set), before) << "the thread's memory policy was not restored";
  hwloc_bitmap_free(set);
}

TEST(Executor, ANodeThatDoesNotExistIsAClearError) {
  Topology t;
  ASSERT_TRUE(t.ok);
  const int nodes = hwloc_get_nbobjs_by_type(t.topo, HWLOC_OBJ_NUMANODE);
  Result<std::unique_ptr<Executor>> ex = Executor::create({.threads = 1, .numa_node = nodes + 7});
  ASSERT_FALSE(ex);
  EXPECT_EQ(ex.error().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(ex.error().message().find("NUMA node " + std::to_string(nodes + 7)), std::string::npos)
      << ex.error().to_string();
  // -1 is no binding; below it is a mistake, not another way to say none.
  Result<std::unique_ptr<Executor>> negative = Executor::create({.threads = 1, .numa_node = -2});
  ASSERT_FALSE(negative);
  EXPECT_EQ(negative.error().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(negative.error().message().find("-2"), std::string::npos) << negative.error().to_string();
}

TEST(Executor, BindingChangesNoBits) {
  Result<std::unique_ptr<Executor>> bound = Executor::create({.threads = 2, .numa_node = 0});
  if (!bound && bound.error().code() == StatusCode::kUnavailable) {
    GTEST_SKIP() << "this machine refuses NUMA binding: " << bound.error().to_string();
  }
  ASSERT_TRUE(bound) << bound.error().to_string();
  Result<std::unique_ptr<Executor>> free_threads = Executor::create({.threads = 2, .numa_node = -1});
  ASSERT_TRUE(free_threads);
  const int64_t n = 100003;
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0, 1);
  std::vector<float> grad(n), p0(n);
  for (float& x : p0) x = nd(rng);
  for (float& x : grad) x = 0.01f * nd(rng);
  auto run = [&](Executor& ex) {
    std::vector<float> p = p0, m(n, 0.0f), v(n, 0.0f);
    ParamSpan s;
    s.params = p.data();
    s.n = n;
    s.grad = grad.data();
    s.grad_dtype = DType::kF32;
    s.state.m = m.data();
    s.state.v = v.data();
    AdamConfig adam;
    adam.weight_decay = 0.1f;
    for (int64_t step_t = 1; step_t <= 3; ++step_t) {
      Result<StepReport> r = step(adam, step_t, s, {}, ex);
      EXPECT_TRUE(r) << r.error().to_string();
    }
    return p;
  };
  const std::vector<float> a = run(**bound), b = run(**free_threads);
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0);
}

// The chunks go to whichever thread is free, not a fixed share per thread:
// chunk 0 waits until every other chunk has run, which only another thread
// taking them all can bring about (with a fixed half per thread, the other
// chunks of chunk 0's half would wait behind it, and the wait would end on
// its deadline with them not run).
TEST(Executor, AFreeThreadTakesTheChunksABusyOneHasNotStarted) {
  // oneTBB's count honours the CPU affinity mask (taskset, a container's
  // cpuset), which the cores online do not.
  if (tbb::info::default_concurrency() < 2) {
    GTEST_SKIP() << "this process may run on one CPU only: no second thread to take the chunks";
  }
  Result<std::unique_ptr<Executor>> ex = Executor::create({.threads = 2});
  ASSERT_TRUE(ex) << ex.error().to_string();
  constexpr int64_t kChunks = 64;
  std::mutex mu;
  std::condition_variable cv;
  int64_t others_done = 0;
  bool all_others_ran = false;
  (*ex)->parallel_for(kChunks, 1, [&](int64_t begin, int64_t) {
    std::unique_lock<std::mutex> lock(mu);
    if (begin != 0) {
      ++others_done;
      cv.notify_all();
      return;
    }
    all_others_ran = cv.wait_for(lock, std::chrono::seconds(60), [&] { return others_done == kChunks - 1; });
  });
  EXPECT_TRUE(all_others_ran) << others_done << " of " << kChunks - 1
                              << " other chunks ran while chunk 0's thread was busy";
  EXPECT_EQ(others_done, kChunks - 1);
}

// zero and copy cover exactly [data, data + bytes) at any size and offset:
// piece boundaries (2 MiB) at +-1, an odd start, nothing for 0 bytes.
TEST(Executor, ZeroAndCopyCoverExactlyTheirBytes) {
  Result<std::unique_ptr<Executor>> ex = Executor::create({.threads = 2});
  ASSERT_TRUE(ex) << ex.error().to_string();
  constexpr size_t kPiece = size_t{1} << 21;
  std::mt19937_64 rng(7);
  for (size_t bytes : {size_t{0}, size_t{1}, kPiece - 1, kPiece, kPiece + 1, 3 * kPiece + 5}) {
    for (size_t offset : {size_t{0}, size_t{3}}) {
      const size_t total = bytes + offset + 16;
      std::vector<unsigned char> src(total), dst(total), expect(total);
      for (auto& b : src) b = static_cast<unsigned char>(rng() | 1);  // never 0
      for (auto& b : dst) b = static_cast<unsigned char>(rng() | 1);
      expect = dst;
      std::memset(expect.data() + offset, 0, bytes);
      (*ex)->zero(dst.data() + offset, bytes);
      EXPECT_EQ(dst, expect) << "zero of " << bytes << " bytes at +" << offset;
      std::memcpy(expect.data() + offset, src.data() + offset, bytes);
      (*ex)->copy(dst.data() + offset, src.data() + offset, bytes);
      EXPECT_EQ(dst, expect) << "copy of " << bytes << " bytes at +" << offset;
    }
  }
}

}  // namespace
}  // namespace strata::cpu_optim
