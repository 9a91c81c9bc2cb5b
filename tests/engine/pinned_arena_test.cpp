#include "engine/pinned_arena.h"

#include <gtest/gtest.h>

#include <set>

#include "common/units.h"
#include "cpu_optim/executor.h"

namespace strata::engine {
namespace {

TEST(PinnedArena, LeasesFixedAlignedBuffersAndIsBounded) {
  io::AlignedAllocator allocator(/*lock_memory=*/false);
  auto ex = std::move(cpu_optim::Executor::create({1, -1})).value();
  Result<std::unique_ptr<PinnedArena>> arena = PinnedArena::create("gradients", 10000, 3, allocator, ex.get());
  ASSERT_TRUE(arena) << arena.error().to_string();
  EXPECT_EQ((*arena)->buffer_bytes(), 12288u);  // rounded to 4 KiB
  {
    std::vector<PinnedArena::Lease> leases;
    std::set<std::byte*> starts;
    for (int i = 0; i < 3; ++i) {
      Result<PinnedArena::Lease> l = (*arena)->acquire("chunk " + std::to_string(i));
      ASSERT_TRUE(l);
      EXPECT_TRUE(is_aligned(l->data(), 4096));
      starts.insert(l->data());
      leases.push_back(std::move(l).value());
    }
    EXPECT_EQ(starts.size(), 3u);
    Result<PinnedArena::Lease> none = (*arena)->acquire("chunk 3");
    ASSERT_FALSE(none);
    EXPECT_EQ(none.error().code(), StatusCode::kResourceExhausted);
    EXPECT_NE(none.error().message().find("'gradients'"), std::string::npos);
    EXPECT_NE(none.error().message().find("chunk 3"), std::string::npos);
    EXPECT_EQ((*arena)->in_use(), 3u);
    leases.pop_back();  // returns its buffer
    EXPECT_TRUE((*arena)->acquire("again").has_value());
  }
  EXPECT_EQ((*arena)->in_use(), 0u);
  EXPECT_EQ((*arena)->high_water(), 3u);
  EXPECT_EQ(PinnedArena::create("x", 0, 1, allocator).error().code(), StatusCode::kInvalidArgument);
}

TEST(PinnedArena, LockedMemoryOrAClearError) {
  io::AlignedAllocator locking(/*lock_memory=*/true);
  Result<std::unique_ptr<PinnedArena>> arena = PinnedArena::create("weights", 1 << 20, 4, locking);
  if (!arena) {
    EXPECT_NE(arena.error().message().find("ulimit -l"), std::string::npos) << arena.error().to_string();
    EXPECT_NE(arena.error().message().find("pinned arena 'weights'"), std::string::npos);
    GTEST_SKIP() << "mlock refused here: " << arena.error().message();
  }
  EXPECT_EQ((*arena)->total_bytes(), 4u << 20);
}

}  // namespace
}  // namespace strata::engine
