// Every fault FaultyDevice injects ends, through IoQueue, as a successful
// retry or a surfaced error with the right code — never as silently changed
// data. Run over the io_uring and POSIX devices.
#include "io/faulty_device.h"

#include <gtest/gtest.h>

#include <cerrno>

#include "common/units.h"
#include "io/buffer.h"
#include "io/device_factory.h"
#include "io/file.h"
#include "io/io_queue.h"
#include "tests/test_util.h"

namespace strata::io {
namespace {

class FaultyDeviceTest : public ::testing::TestWithParam<Backend> {
 protected:
  void SetUp() override {
    std::string why;
    if (GetParam() == Backend::kUring && !strata::testing::uring_available(&why)) GTEST_SKIP() << why;
    DeviceOptions options;
    options.backend = GetParam();
    options.queue_depth = 16;
    Result<std::unique_ptr<BlockDevice>> dev = make_block_device(options);
    ASSERT_TRUE(dev) << dev.error().to_string();
    inner_ = std::move(dev).value();
    Result<File> file = File::open(dir_.path() + "/f.bin", FileOptions{});
    ASSERT_TRUE(file) << file.error().to_string();
    file_ = std::move(file).value();
  }

  void make(const FaultConfig& config) {
    faulty_ = std::make_unique<FaultyDevice>(*inner_, config);
    queue_ = std::make_unique<IoQueue>(*faulty_);
    Result<int32_t> slot = queue_->attach(file_.fd(), file_.path(), file_.alignment());
    ASSERT_TRUE(slot);
    slot_ = *slot;
  }

  void TearDown() override {
    queue_.reset();
    faulty_.reset();
  }

  // Runs `count` requests of `block` bytes of kind `op` and returns their statuses by block index.
  std::vector<Status> run(IoOp op, Buffer& buf, uint64_t count, uint64_t block) {
    for (uint64_t i = 0; i < count; ++i) {
      Status s = queue_->submit({op, slot_, i * block, buf.data() + i * block, block, i});
      EXPECT_TRUE(s.ok()) << s.to_string();
    }
    std::vector<IoResult> results;
    Result<size_t> n = queue_->wait(count, results);
    EXPECT_TRUE(n.has_value());
    std::vector<Status> by_index(count);
    for (IoResult& r : results) by_index[r.tag] = std::move(r.status);
    return by_index;
  }

  strata::testing::TempDir dir_;
  File file_;
  std::unique_ptr<BlockDevice> inner_;
  std::unique_ptr<FaultyDevice> faulty_;
  std::unique_ptr<IoQueue> queue_;
  int32_t slot_ = -1;
};

TEST_P(FaultyDeviceTest, TransientFaultsEndAsSuccessfulRetries) {
  uint64_t seed = strata::testing::test_seed(21);
  FaultConfig config;
  config.seed = seed;
  config.eio_transient_one_in = 20;
  config.eagain_one_in = 5;
  config.eintr_one_in = 6;
  config.short_transfer_one_in = 3;
  config.latency_one_in = 4;
  config.latency_us = 300;
  config.reorder = true;
  make(config);
  const uint64_t count = 200, block = 64 * kKiB;
  Result<Buffer> out = allocate_aligned(count * block);
  Result<Buffer> in = allocate_aligned(count * block);
  ASSERT_TRUE(out && in);
  strata::testing::fill_stamped(out->data(), count * block, 0, seed);
  for (const Status& s : run(IoOp::kWrite, *out, count, block)) ASSERT_TRUE(s.ok()) << s.to_string();
  for (const Status& s : run(IoOp::kRead, *in, count, block)) ASSERT_TRUE(s.ok()) << s.to_string();
  EXPECT_EQ(strata::testing::check_stamped(in->data(), count * block, 0, seed), "");
  const FaultCounters& c = faulty_->counters();
  EXPECT_GT(c.eio_transient, 0u);
  EXPECT_GT(c.eagain, 0u);
  EXPECT_GT(c.eintr, 0u);
  EXPECT_GT(c.short_transfers, 0u);
  EXPECT_GT(c.delayed, 0u);
}

TEST_P(FaultyDeviceTest, PersistentEioSurfacesNamingFileAndOffset) {
  make(FaultConfig{});
  Result<Buffer> buf = allocate_aligned(4 * 65536);
  ASSERT_TRUE(buf);
  faulty_->add_bad_range(slot_, 2 * 65536 + 4096, 4096);
  std::vector<Status> st = run(IoOp::kWrite, *buf, 4, 65536);
  EXPECT_TRUE(st[0].ok() && st[1].ok() && st[3].ok());
  ASSERT_FALSE(st[2].ok());
  EXPECT_EQ(st[2].code(), StatusCode::kUnavailable);
  std::string m(st[2].message());
  EXPECT_NE(m.find(file_.path()), std::string::npos) << m;
  EXPECT_NE(m.find("offset 131072"), std::string::npos) << m;
  EXPECT_NE(m.find("EIO"), std::string::npos) << m;
  EXPECT_EQ(faulty_->counters().eio_persistent, 1u + RetryPolicy{}.max_eio_retries);
}

TEST_P(FaultyDeviceTest, EnospcAndEinvalSurfaceWithTheirCodes) {
  make(FaultConfig{});
  Result<Buffer> buf = allocate_aligned(65536);
  ASSERT_TRUE(buf);
  faulty_->fail_next(IoOp::kWrite, ENOSPC);
  EXPECT_EQ(run(IoOp::kWrite, *buf, 1, 65536)[0].code(), StatusCode::kResourceExhausted);
  faulty_->fail_next(IoOp::kRead, EINVAL);
  EXPECT_EQ(run(IoOp::kRead, *buf, 1, 65536)[0].code(), StatusCode::kInvalidArgument);
  faulty_->fail_next(IoOp::kRead, EAGAIN, 100);
  Status s = run(IoOp::kRead, *buf, 1, 65536)[0];
  EXPECT_EQ(s.code(), StatusCode::kUnavailable);
  EXPECT_NE(s.message().find("EAGAIN"), std::string::npos) << s.to_string();
}

// A file that ends before the data asked for is DataLoss naming the short
// read, whether the request starts past the end or crosses it (its first
// part is read, the rest resubmitted, and that finds nothing).
TEST_P(FaultyDeviceTest, AFileThatEndsEarlyIsAShortReadError) {
  make(FaultConfig{});
  Result<Buffer> buf = allocate_aligned(4 * 65536);
  ASSERT_TRUE(buf);
  for (const Status& s : run(IoOp::kWrite, *buf, 4, 65536)) ASSERT_TRUE(s.ok()) << s.to_string();
  faulty_->end_file_at(slot_, 2 * 65536 + 8192);
  std::vector<Status> st = run(IoOp::kRead, *buf, 4, 65536);
  EXPECT_TRUE(st[0].ok() && st[1].ok());
  for (int i : {2, 3}) {
    ASSERT_FALSE(st[static_cast<size_t>(i)].ok()) << i;
    EXPECT_EQ(st[static_cast<size_t>(i)].code(), StatusCode::kDataLoss);
    std::string m(st[static_cast<size_t>(i)].message());
    EXPECT_NE(m.find("short read"), std::string::npos) << m;
    EXPECT_NE(m.find(file_.path()), std::string::npos) << m;
  }
  EXPECT_NE(std::string(st[2].message()).find("after 8192 of 65536"), std::string::npos) << st[2].to_string();
  EXPECT_EQ(faulty_->counters().past_end, 3u);  // block 2, its resubmitted rest, block 3
  std::vector<Status> writes = run(IoOp::kWrite, *buf, 4, 65536);
  for (const Status& s : writes) EXPECT_TRUE(s.ok()) << s.to_string();
}

TEST_P(FaultyDeviceTest, SameSeedInjectsTheSameFaults) {
  auto counters_for = [&](uint64_t seed) {
    FaultConfig config;
    config.seed = seed;
    config.eio_transient_one_in = 4;
    config.short_transfer_one_in = 3;
    make(config);
    Result<Buffer> buf = allocate_aligned(64 * 65536);
    EXPECT_TRUE(buf);
    // One at a time, so the request order (and so the draw order) is fixed.
    for (uint64_t i = 0; i < 64; ++i) {
      EXPECT_TRUE(queue_->submit({IoOp::kWrite, slot_, i * 65536, buf->data() + i * 65536, 65536, i}).ok());
      std::vector<IoResult> r;
      EXPECT_TRUE(queue_->wait(1, r).has_value());
    }
    FaultCounters c = faulty_->counters();
    TearDown();
    return std::make_pair(c.eio_transient, c.short_transfers);
  };
  auto a = counters_for(5);
  auto b = counters_for(5);
  EXPECT_EQ(a, b);
  EXPECT_GT(a.first + a.second, 0u);
}

INSTANTIATE_TEST_SUITE_P(Backends, FaultyDeviceTest, ::testing::Values(Backend::kUring, Backend::kPosix),
                         [](const auto& p) { return std::string(backend_name(p.param)); });

}  // namespace
}  // namespace strata::io
