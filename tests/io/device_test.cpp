// IoQueue over each real BlockDevice (io_uring and POSIX): bit-exact round
// trips at awkward sizes, many concurrent requests, alignment checks, bounds
// and shutdown with requests in flight. The POSIX device passes the same suite.
#include <gtest/gtest.h>

#include <random>

#include "common/units.h"
#include "io/buffer.h"
#include "io/device_factory.h"
#include "io/file.h"
#include "io/io_queue.h"
#include "tests/test_util.h"

namespace strata::io {
namespace {

class DeviceTest : public ::testing::TestWithParam<Backend> {
 protected:
  void SetUp() override {
    std::string why;
    if (GetParam() == Backend::kUring && !strata::testing::uring_available(&why)) GTEST_SKIP() << why;
    DeviceOptions options;
    options.backend = GetParam();
    options.queue_depth = 32;
    Result<std::unique_ptr<BlockDevice>> dev = make_block_device(options);
    ASSERT_TRUE(dev) << dev.error().to_string();
    device_ = std::move(dev).value();
  }

  // Writes then reads back `size` bytes at `offset` through `queue`.
  void round_trip(IoQueue& queue, int32_t slot, uint64_t offset, uint64_t size, uint64_t alignment, uint64_t seed) {
    SCOPED_TRACE("size " + std::to_string(size) + " offset " + std::to_string(offset));
    Result<Buffer> out = allocate_aligned(round_up(size, alignment), 4096);
    Result<Buffer> in = allocate_aligned(round_up(size, alignment), 4096);
    ASSERT_TRUE(out && in);
    strata::testing::fill_stamped(out->data(), size, offset, seed);
    std::vector<IoResult> results;
    ASSERT_TRUE(queue.submit({IoOp::kWrite, slot, offset, out->data(), size, 1}).ok());
    ASSERT_TRUE(queue.wait(1, results).has_value());
    ASSERT_EQ(results.size(), 1u);
    ASSERT_TRUE(results[0].status.ok()) << results[0].status.to_string();
    results.clear();
    ASSERT_TRUE(queue.submit({IoOp::kRead, slot, offset, in->data(), size, 2}).ok());
    ASSERT_TRUE(queue.wait(1, results).has_value());
    ASSERT_TRUE(results[0].status.ok()) << results[0].status.to_string();
    EXPECT_EQ(strata::testing::check_stamped(in->data(), size, offset, seed), "");
  }

  std::unique_ptr<BlockDevice> device_;
};

TEST_P(DeviceTest, DirectRoundTripsAtBlockMultiples) {
  uint64_t seed = strata::testing::test_seed(11);
  strata::testing::TempDir dir;
  Result<File> file = File::open(dir.path() + "/d.bin", FileOptions{});
  ASSERT_TRUE(file) << file.error().to_string();
  IoQueue queue(*device_);
  Result<int32_t> slot = queue.attach(file->fd(), file->path(), file->alignment());
  ASSERT_TRUE(slot);
  uint64_t a = file->alignment();
  uint64_t offset = 0;
  for (uint64_t size : {a, 3 * a, 128 * kKiB, kMiB + a, 8 * kMiB, 64 * kMiB}) {
    round_trip(queue, *slot, offset, size, a, seed);
    offset += size + a;  // leave holes so neighbours are not touched
  }
  EXPECT_TRUE(queue.detach(*slot).ok());
}

TEST_P(DeviceTest, BufferedRoundTripsAtAwkwardSizes) {
  uint64_t seed = strata::testing::test_seed(12);
  strata::testing::TempDir dir;
  Result<File> file = File::open(dir.path() + "/b.bin", FileOptions{true, true, DirectMode::kOff});
  ASSERT_TRUE(file);
  IoQueue queue(*device_);
  Result<int32_t> slot = queue.attach(file->fd(), file->path(), 1);
  ASSERT_TRUE(slot);
  uint64_t offset = 1;
  for (uint64_t size : {uint64_t{1}, uint64_t{7}, uint64_t{4095}, uint64_t{4097}, kMiB - 1, kMiB + 1}) {
    round_trip(queue, *slot, offset, size, 1, seed);
    offset += size + 3;
  }
}

TEST_P(DeviceTest, ManyConcurrentRequests) {
  uint64_t seed = strata::testing::test_seed(13);
  strata::testing::TempDir dir;
  Result<File> file = File::open(dir.path() + "/c.bin", FileOptions{});
  ASSERT_TRUE(file);
  IoQueue queue(*device_);
  Result<int32_t> slot = queue.attach(file->fd(), file->path(), file->alignment());
  ASSERT_TRUE(slot);
  constexpr int kRequests = 500;
  const uint64_t block = 16 * kKiB;
  Result<Buffer> out = allocate_aligned(kRequests * block);
  Result<Buffer> in = allocate_aligned(kRequests * block);
  ASSERT_TRUE(out && in);
  strata::testing::fill_stamped(out->data(), kRequests * block, 0, seed);
  // Shuffled block order: completions arrive in any order.
  std::vector<int> order(kRequests);
  for (int i = 0; i < kRequests; ++i) order[i] = i;
  std::shuffle(order.begin(), order.end(), std::mt19937_64(seed));
  for (IoOp op : {IoOp::kWrite, IoOp::kRead}) {
    Buffer& buf = op == IoOp::kWrite ? *out : *in;
    for (int i : order) {
      IoRequest r{op, *slot, i * block, buf.data() + i * block, block, static_cast<uint64_t>(i)};
      ASSERT_TRUE(queue.submit(r).ok());
    }
    std::vector<IoResult> results;
    ASSERT_TRUE(queue.wait(kRequests, results).has_value());
    ASSERT_EQ(results.size(), static_cast<size_t>(kRequests));
    std::vector<bool> seen(kRequests, false);
    for (const IoResult& r : results) {
      ASSERT_TRUE(r.status.ok()) << r.status.to_string();
      ASSERT_FALSE(seen[r.tag]);
      seen[r.tag] = true;
    }
  }
  EXPECT_EQ(strata::testing::check_stamped(in->data(), kRequests * block, 0, seed), "");
}

TEST_P(DeviceTest, MisalignedRequestsAreRejectedBeforeSubmission) {
  strata::testing::TempDir dir;
  Result<File> file = File::open(dir.path() + "/m.bin", FileOptions{});
  ASSERT_TRUE(file);
  IoQueue queue(*device_);
  Result<int32_t> slot = queue.attach(file->fd(), file->path(), file->alignment());
  ASSERT_TRUE(slot);
  Result<Buffer> buf = allocate_aligned(64 * kKiB);
  ASSERT_TRUE(buf);
  uint64_t a = file->alignment();
  IoRequest bad_addr{IoOp::kWrite, *slot, 0, buf->data() + 1, a, 0};
  IoRequest bad_off{IoOp::kWrite, *slot, 512, buf->data(), a, 0};
  IoRequest bad_len{IoOp::kWrite, *slot, 0, buf->data(), a + 1, 0};
  IoRequest empty{IoOp::kWrite, *slot, 0, buf->data(), 0, 0};
  for (const IoRequest& r : {bad_addr, bad_off, bad_len, empty}) {
    Status s = queue.submit(r);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
    EXPECT_NE(s.message().find(file->path()), std::string::npos) << s.to_string();
  }
  EXPECT_EQ(queue.outstanding(), 0u);
}

TEST_P(DeviceTest, QueueIsBounded) {
  strata::testing::TempDir dir;
  Result<File> file = File::open(dir.path() + "/q.bin", FileOptions{});
  ASSERT_TRUE(file);
  IoQueueOptions options;
  options.max_pending = 4;
  IoQueue queue(*device_, options);
  Result<int32_t> slot = queue.attach(file->fd(), file->path(), file->alignment());
  ASSERT_TRUE(slot);
  Result<Buffer> buf = allocate_aligned(5 * 4096);
  ASSERT_TRUE(buf);
  for (uint64_t i = 0; i < 4; ++i) {
    ASSERT_TRUE(queue.submit({IoOp::kWrite, *slot, i * 4096, buf->data() + i * 4096, 4096, i}).ok());
  }
  Status s = queue.submit({IoOp::kWrite, *slot, 4 * 4096, buf->data() + 4 * 4096, 4096, 4});
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  std::vector<IoResult> results;
  ASSERT_TRUE(queue.wait(4, results).has_value());
  EXPECT_EQ(results.size(), 4u);
}

TEST_P(DeviceTest, ShutdownWithRequestsInFlightReapsEverything) {
  strata::testing::TempDir dir;
  Result<File> file = File::open(dir.path() + "/s.bin", FileOptions{});
  ASSERT_TRUE(file);
  Result<Buffer> buf = allocate_aligned(64 * kMiB);
  ASSERT_TRUE(buf);
  {
    IoQueue queue(*device_);
    Result<int32_t> slot = queue.attach(file->fd(), file->path(), file->alignment());
    ASSERT_TRUE(slot);
    for (uint64_t i = 0; i < 64; ++i) {
      ASSERT_TRUE(queue.submit({IoOp::kWrite, *slot, i * kMiB, buf->data() + i * kMiB, kMiB, i}).ok());
    }
    // queue goes out of scope with requests in flight and in its backlog
  }
  EXPECT_EQ(device_->in_flight(), 0u);
}

INSTANTIATE_TEST_SUITE_P(Backends, DeviceTest, ::testing::Values(Backend::kUring, Backend::kPosix),
                         [](const auto& p) { return std::string(backend_name(p.param)); });

}  // namespace
}  // namespace strata::io

namespace strata::io {
namespace {

// io_uring refuses depths above 32768, the POSIX pool does not: with
// Backend::kAuto the factory must fall back (with its notice) instead of failing.
TEST(DeviceFactory, AutoFallsBackToPosixWhenIoUringCannotBeSetUp) {
  DeviceOptions options;
  options.backend = Backend::kAuto;
  options.queue_depth = 40000;
  ::testing::internal::CaptureStderr();
  Result<std::unique_ptr<BlockDevice>> dev = make_block_device(options);
  std::string notice = ::testing::internal::GetCapturedStderr();
  ASSERT_TRUE(dev) << dev.error().to_string();
  EXPECT_EQ((*dev)->name(), "posix");
  EXPECT_NE(notice.find("io_uring unavailable"), std::string::npos) << notice;
  options.backend = Backend::kUring;
  Result<std::unique_ptr<BlockDevice>> strict = make_block_device(options);
  ASSERT_FALSE(strict);
  EXPECT_EQ(strict.error().code(), StatusCode::kInvalidArgument);
  EXPECT_FALSE(parse_backend("spdk"));
}

TEST(Buffers, AlignedLockedAndReleased) {
  AlignedAllocator locking(/*lock_memory=*/true);
  Result<Buffer> b = locking.allocate(100000, 4096);
  if (!b) {
    // Without CAP_IPC_LOCK a small RLIMIT_MEMLOCK refuses: the error must say how to fix it.
    EXPECT_EQ(b.error().code(), StatusCode::kResourceExhausted);
    EXPECT_NE(b.error().message().find("ulimit -l"), std::string::npos) << b.error().to_string();
    GTEST_SKIP() << "mlock refused here: " << b.error().message();
  }
  EXPECT_TRUE(b->locked());
  EXPECT_TRUE(is_aligned(b->data(), 4096));
  EXPECT_EQ(b->capacity_bytes(), round_up(100000, 4096));
  EXPECT_EQ(b->data()[12345], std::byte{0});  // zero-filled
  Buffer moved = std::move(*b);
  EXPECT_EQ(b->data(), nullptr);
  EXPECT_TRUE(moved.locked());
  EXPECT_EQ(allocate_aligned(4096, 3).error().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace strata::io
