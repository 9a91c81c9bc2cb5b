// SwapStore: round trips at awkward sizes, striping over several
// directories, checksums, budgets, every injected fault, a real full disk.
// Runs over the io_uring and POSIX backends.
#include "io/swap_store.h"

#include <gtest/gtest.h>
#include <linux/magic.h>
#include <sys/vfs.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <thread>

#include "common/units.h"
#include "tests/test_util.h"

namespace strata::io {
namespace {

class SwapStoreTest : public ::testing::TestWithParam<Backend> {
 protected:
  void SetUp() override {
    std::string why;
    if (GetParam() == Backend::kUring && !strata::testing::uring_available(&why)) GTEST_SKIP() << why;
  }

  SwapStoreOptions options(int ndirs, uint64_t stripe = 64 * kKiB) {
    SwapStoreOptions o;
    for (int i = 0; i < ndirs; ++i) o.directories.push_back(dir_.sub("nvme" + std::to_string(i)));
    o.stripe_unit_bytes = stripe;
    o.device.backend = GetParam();
    o.device.queue_depth = 32;
    return o;
  }

  std::unique_ptr<SwapStore> open(const SwapStoreOptions& o) {
    Result<std::unique_ptr<SwapStore>> store = SwapStore::open(o);
    EXPECT_TRUE(store) << store.error().to_string();
    return store ? std::move(store).value() : nullptr;
  }

  static Buffer buffer_for(const SwapStore& store, uint64_t size) {
    Result<Buffer> b = allocate_aligned(std::max<uint64_t>(store.padded_size(size), 4096), store.alignment());
    EXPECT_TRUE(b);
    return std::move(b).value();
  }

  static Status write_sync(SwapStore& s, const std::string& name, const Buffer& b, uint64_t size) {
    Result<Ticket> t = s.write(name, b.view(), size);
    if (!t) return t.error();
    return s.wait(*t);
  }
  static Status read_sync(SwapStore& s, const std::string& name, const Buffer& b) {
    Result<Ticket> t = s.read(name, b.view());
    if (!t) return t.error();
    return s.wait(*t);
  }

  strata::testing::TempDir dir_;
};

TEST_P(SwapStoreTest, RoundTripsAtAwkwardSizesOverOneAndThreeDirectories) {
  uint64_t seed = strata::testing::test_seed(31);
  for (int ndirs : {1, 3}) {
    auto store = open(options(ndirs));
    ASSERT_TRUE(store);
    uint64_t a = store->alignment();
    std::vector<uint64_t> sizes = {1, 7, a - 1, a, a + 1, 64 * kKiB - 1, 64 * kKiB + 1, kMiB - 1, kMiB + 1,
                                   3 * kMiB + 12345, 64 * kMiB};
    for (uint64_t size : sizes) {
      SCOPED_TRACE("dirs " + std::to_string(ndirs) + " size " + std::to_string(size));
      Buffer out = buffer_for(*store, size), in = buffer_for(*store, size);
      strata::testing::fill_stamped(out.data(), size, size, seed);
      std::string name = "blob" + std::to_string(size);
      ASSERT_TRUE(write_sync(*store, name, out, size).ok());
      Status s = read_sync(*store, name, in);
      ASSERT_TRUE(s.ok()) << s.to_string();
      ASSERT_EQ(strata::testing::check_stamped(in.data(), size, size, seed), "");
      EXPECT_EQ(*store->blob_size(name), size);
    }
    if (ndirs == 3) {
      // 64 MiB over 64 KiB units: each directory got a third of the bytes.
      SwapStoreStats st = store->stats();
      for (const DirectoryStats& d : st.directories) EXPECT_GT(d.bytes_written, 21 * kMiB) << d.path;
      auto pieces = store->locate("blob" + std::to_string(64 * kMiB));
      ASSERT_TRUE(pieces);
      EXPECT_EQ(pieces->size(), 1024u);
      EXPECT_NE((*pieces)[0].directory, (*pieces)[1].directory);
    }
  }
}

TEST_P(SwapStoreTest, ManyBlobsInFlightAtOnce) {
  uint64_t seed = strata::testing::test_seed(32);
  auto store = open(options(2, 128 * kKiB));
  ASSERT_TRUE(store);
  constexpr int kBlobs = 24;
  std::vector<Buffer> outs, ins;
  std::vector<uint64_t> sizes;
  std::mt19937_64 rng(seed);
  for (int i = 0; i < kBlobs; ++i) {
    sizes.push_back(1 + rng() % (3 * kMiB));
    outs.push_back(buffer_for(*store, sizes[i]));
    ins.push_back(buffer_for(*store, sizes[i]));
    strata::testing::fill_stamped(outs[i].data(), sizes[i], i, seed);
  }
  std::vector<Ticket> tickets;
  for (int i = 0; i < kBlobs; ++i) {
    Result<Ticket> t = store->write("b" + std::to_string(i), outs[i].view(), sizes[i]);
    ASSERT_TRUE(t) << t.error().to_string();
    tickets.push_back(*t);
  }
  // A blob with a write in flight cannot be read or removed.
  EXPECT_EQ(store->read("b0", ins[0].view()).error().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(store->remove("b0").code(), StatusCode::kFailedPrecondition);
  for (int i = kBlobs - 1; i >= 0; --i) ASSERT_TRUE(store->wait(tickets[i]).ok());
  tickets.clear();
  for (int i = 0; i < kBlobs; ++i) tickets.push_back(*store->read("b" + std::to_string(i), ins[i].view()));
  ASSERT_TRUE(store->wait_all().ok());
  for (int i = 0; i < kBlobs; ++i) ASSERT_EQ(strata::testing::check_stamped(ins[i].data(), sizes[i], i, seed), "") << i;
}

// Two threads sharing one store (one ring), each writing and reading back
// its own blobs while the other does the same, some ops in flight while
// waiting: every byte comes back as written.
TEST_P(SwapStoreTest, TwoThreadsShareOneStore) {
  auto store = open(options(2, 256 * kKiB));
  ASSERT_TRUE(store);
  uint64_t seed = strata::testing::test_seed(34);
  std::atomic<int> bad{0};
  auto worker = [&](int id) {
    std::vector<Buffer> out, in;
    for (int k = 0; k < 3; ++k) {
      out.push_back(buffer_for(*store, 700 * kKiB));
      in.push_back(buffer_for(*store, 700 * kKiB));
    }
    for (int round = 0; round < 20; ++round) {
      std::vector<Ticket> writes;
      for (int k = 0; k < 3; ++k) {
        const uint64_t stamp = seed + static_cast<uint64_t>(id * 1000 + round * 10 + k);
        strata::testing::fill_stamped(out[k].data(), 700 * kKiB, id, stamp);
        Result<Ticket> t = store->write("t" + std::to_string(id) + "-" + std::to_string(k), out[k].view(), 700 * kKiB);
        if (!t) {
          ++bad;
          return;
        }
        writes.push_back(*t);
      }
      for (Ticket t : writes) bad += store->wait(t).ok() ? 0 : 1;
      for (int k = 0; k < 3; ++k) {
        Result<Ticket> t = store->read("t" + std::to_string(id) + "-" + std::to_string(k), in[k].view());
        if (!t || !store->wait(*t).ok()) {
          ++bad;
          return;
        }
        const uint64_t stamp = seed + static_cast<uint64_t>(id * 1000 + round * 10 + k);
        if (!strata::testing::check_stamped(in[k].data(), 700 * kKiB, id, stamp).empty()) ++bad;
      }
    }
  };
  std::thread a(worker, 1), b(worker, 2);
  a.join();
  b.join();
  EXPECT_EQ(bad.load(), 0);
  EXPECT_EQ(store->stats().used_bytes, 6 * store->padded_size(700 * kKiB));
}

// Faults set and cleared under the store's lock while another thread's
// requests are in flight (persistent ones: the I/O layer retries a few
// EIOs unseen): each failure reaches that thread as an error,
// never as wrong data, and once cleared its requests work again. Without
// an injector with_faults says so and calls nothing.
TEST_P(SwapStoreTest, FaultsChangeUnderTheLockBesideRequestsInFlight) {
  auto plain = open(options(1));
  ASSERT_TRUE(plain);
  EXPECT_FALSE(plain->with_faults([](FaultyDevice&) { ADD_FAILURE() << "called without an injector"; }));
  SwapStoreOptions o = options(2);
  o.faults = FaultConfig{};
  auto store = open(o);
  ASSERT_TRUE(store);
  const uint64_t seed = strata::testing::test_seed(35);
  std::atomic<bool> stop{false};
  std::atomic<int> failed{0}, wrong{0}, done{0};
  std::thread io([&] {
    Buffer out = buffer_for(*store, 300 * kKiB), in = buffer_for(*store, 300 * kKiB);
    for (uint64_t round = 0; !stop.load(); ++round) {
      strata::testing::fill_stamped(out.data(), 300 * kKiB, 0, seed + round);
      if (!write_sync(*store, "b", out, 300 * kKiB).ok() || !read_sync(*store, "b", in).ok()) {
        ++failed;
        continue;
      }
      if (!strata::testing::check_stamped(in.data(), 300 * kKiB, 0, seed + round).empty()) ++wrong;
      ++done;
    }
  });
  auto wait_until = [](const std::function<bool()>& ok) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (!ok() && std::chrono::steady_clock::now() < end) std::this_thread::sleep_for(std::chrono::microseconds(200));
    return ok();
  };
  ASSERT_TRUE(wait_until([&] { return done.load() > 0; }));
  for (int k = 0; k < 6; ++k) {
    const int failed_before = failed.load(), done_before = done.load();
    EXPECT_TRUE(store->with_faults([&](FaultyDevice& d) { d.fail_next(k % 2 ? IoOp::kRead : IoOp::kWrite, EIO, 1000); }));
    EXPECT_TRUE(wait_until([&] { return failed.load() > failed_before; })) << "fault " << k << " never struck";
    EXPECT_TRUE(store->with_faults([](FaultyDevice& d) { d.clear_forced(); }));
    EXPECT_TRUE(wait_until([&] { return done.load() > done_before + 1; })) << "no round worked after fault " << k;
  }
  stop = true;
  io.join();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_GE(failed.load(), 6);
  std::printf("%d rounds worked, %d met an injected fault (seed %llu)\n", done.load(), failed.load(),
              static_cast<unsigned long long>(seed));
}

TEST_P(SwapStoreTest, OverwriteInPlaceAndResizeAndRemove) {
  auto store = open(options(1));
  ASSERT_TRUE(store);
  Buffer out = buffer_for(*store, kMiB), in = buffer_for(*store, kMiB);
  strata::testing::fill_stamped(out.data(), kMiB, 0, 1);
  ASSERT_TRUE(write_sync(*store, "x", out, kMiB).ok());
  uint64_t used = store->stats().used_bytes;
  auto before = *store->locate("x");
  strata::testing::fill_stamped(out.data(), kMiB, 0, 2);
  ASSERT_TRUE(write_sync(*store, "x", out, kMiB).ok());
  EXPECT_EQ(store->stats().used_bytes, used);
  EXPECT_EQ((*store->locate("x"))[0].file_offset_bytes, before[0].file_offset_bytes);  // in place
  ASSERT_TRUE(read_sync(*store, "x", in).ok());
  EXPECT_EQ(strata::testing::check_stamped(in.data(), kMiB, 0, 2), "");
  ASSERT_TRUE(write_sync(*store, "x", out, 100).ok());
  EXPECT_EQ(store->stats().used_bytes, store->padded_size(100));
  ASSERT_TRUE(store->remove("x").ok());
  EXPECT_EQ(store->stats().used_bytes, 0u);
  EXPECT_EQ(store->read("x", in.view()).error().code(), StatusCode::kNotFound);
  // Freed space is reused rather than growing the file.
  uint64_t file_bytes = store->stats().directories[0].file_bytes;
  ASSERT_TRUE(write_sync(*store, "y", out, kMiB).ok());
  EXPECT_EQ(store->stats().directories[0].file_bytes, file_bytes);
}

TEST_P(SwapStoreTest, ChecksumCatchesAFlippedByte) {
  SwapStoreOptions o = options(2);
  o.faults = FaultConfig{};
  auto store = open(o);
  ASSERT_TRUE(store);
  const uint64_t size = 300 * kKiB;
  Buffer out = buffer_for(*store, size), in = buffer_for(*store, size);
  strata::testing::fill_stamped(out.data(), size, 0, 3);
  ASSERT_TRUE(write_sync(*store, "w", out, size).ok());
  auto pieces = *store->locate("w");
  const PieceLocation& p = pieces[2];
  store->faults()->corrupt_byte(p.file_slot, p.file_offset_bytes + 1234);
  Status s = read_sync(*store, "w", in);
  ASSERT_EQ(s.code(), StatusCode::kDataLoss) << s.to_string();
  EXPECT_NE(s.message().find("checksum mismatch"), std::string::npos) << s.to_string();
  EXPECT_NE(s.message().find("'w'"), std::string::npos) << s.to_string();
  // Persistent: a retry sees the same corruption, not a lucky clean read.
  EXPECT_EQ(read_sync(*store, "w", in).code(), StatusCode::kDataLoss);
  // Rewriting the blob heals it.
  ASSERT_TRUE(write_sync(*store, "w", out, size).ok());
  ASSERT_TRUE(read_sync(*store, "w", in).ok());
  EXPECT_EQ(strata::testing::check_stamped(in.data(), size, 0, 3), "");
}

// read_prefix reads the stripe units the prefix touches, whole and checked,
// and nothing past them; a prefix past the end reads the whole blob.
TEST_P(SwapStoreTest, PrefixReadsTheUnitsItTouchesAndChecksThem) {
  SwapStoreOptions o = options(2);
  o.faults = FaultConfig{};
  auto store = open(o);
  ASSERT_TRUE(store);
  const uint64_t unit = 64 * kKiB, size = 3 * unit + 5000;
  Buffer out = buffer_for(*store, size), in = buffer_for(*store, size);
  strata::testing::fill_stamped(out.data(), size, 0, 8);
  ASSERT_TRUE(write_sync(*store, "p", out, size).ok());
  auto bytes_read = [&] {
    uint64_t n = 0;
    for (const DirectoryStats& d : store->stats().directories) n += d.bytes_read;
    return n;
  };
  auto read_prefix = [&](uint64_t prefix, IoBuffer buffer) -> Status {
    Result<Ticket> t = store->read_prefix("p", buffer, prefix);
    if (!t) return t.error();
    return store->wait(*t);
  };
  std::memset(in.data(), 0xEE, size);
  uint64_t before = bytes_read();
  ASSERT_TRUE(read_prefix(unit + 1, in.view()).ok());
  EXPECT_EQ(bytes_read() - before, 2 * unit);
  EXPECT_EQ(strata::testing::check_stamped(in.data(), 2 * unit, 0, 8), "");
  EXPECT_EQ(std::to_integer<int>(in.data()[2 * unit]), 0xEE);  // the third unit is not read
  // The buffer need hold only what is read; one byte less is refused.
  EXPECT_TRUE(read_prefix(unit, IoBuffer{in.data(), unit}).ok());
  Status small = read_prefix(unit + 1, IoBuffer{in.data(), 2 * unit - 4096});
  EXPECT_EQ(small.code(), StatusCode::kInvalidArgument) << small.to_string();
  // A flipped byte in a unit the prefix touches is caught, even past the
  // prefix; one in a unit it does not touch is not read at all.
  auto pieces = *store->locate("p");
  ASSERT_EQ(pieces.size(), 4u);
  store->faults()->corrupt_byte(pieces[1].file_slot, pieces[1].file_offset_bytes + unit - 10);
  store->faults()->corrupt_byte(pieces[3].file_slot, pieces[3].file_offset_bytes + 10);
  EXPECT_TRUE(read_prefix(unit, in.view()).ok());
  Status caught = read_prefix(unit + 1, in.view());
  EXPECT_EQ(caught.code(), StatusCode::kDataLoss) << caught.to_string();
  EXPECT_EQ(read_prefix(UINT64_MAX, in.view()).code(), StatusCode::kDataLoss);
  ASSERT_TRUE(write_sync(*store, "p", out, size).ok());
  before = bytes_read();
  ASSERT_TRUE(read_prefix(size + 1, in.view()).ok());
  EXPECT_EQ(bytes_read() - before, store->padded_size(size));
  EXPECT_EQ(strata::testing::check_stamped(in.data(), size, 0, 8), "");
}

TEST_P(SwapStoreTest, WithoutChecksumsTheSameFlipGoesUnnoticed) {
  // Shows the checksum, not something else, is what catches corruption.
  SwapStoreOptions o = options(1);
  o.faults = FaultConfig{};
  o.checksums = false;
  auto store = open(o);
  ASSERT_TRUE(store);
  Buffer out = buffer_for(*store, 8192), in = buffer_for(*store, 8192);
  strata::testing::fill_stamped(out.data(), 8192, 0, 4);
  ASSERT_TRUE(write_sync(*store, "w", out, 8192).ok());
  auto p = (*store->locate("w"))[0];
  store->faults()->corrupt_byte(p.file_slot, p.file_offset_bytes + 5);
  ASSERT_TRUE(read_sync(*store, "w", in).ok());
  EXPECT_NE(strata::testing::check_stamped(in.data(), 8192, 0, 4), "");
}

TEST_P(SwapStoreTest, FailedWriteLeavesNoValidBlobAndSparesOthers) {
  SwapStoreOptions o = options(1);
  o.faults = FaultConfig{};
  auto store = open(o);
  ASSERT_TRUE(store);
  Buffer out = buffer_for(*store, kMiB), in = buffer_for(*store, kMiB);
  strata::testing::fill_stamped(out.data(), kMiB, 0, 5);
  ASSERT_TRUE(write_sync(*store, "good", out, kMiB).ok());
  ASSERT_TRUE(write_sync(*store, "bad", out, kMiB).ok());
  // A persistent EIO under the second piece of "bad": its rewrite fails.
  auto p = (*store->locate("bad"))[1];
  store->faults()->add_bad_range(p.file_slot, p.file_offset_bytes, 4096);
  Status s = write_sync(*store, "bad", out, kMiB);
  ASSERT_EQ(s.code(), StatusCode::kUnavailable) << s.to_string();
  EXPECT_NE(s.message().find("EIO"), std::string::npos);
  Status r = read_sync(*store, "bad", in);
  EXPECT_EQ(r.code(), StatusCode::kDataLoss) << r.to_string();
  EXPECT_NE(r.message().find("last write failed"), std::string::npos) << r.to_string();
  ASSERT_TRUE(read_sync(*store, "good", in).ok());
  EXPECT_EQ(strata::testing::check_stamped(in.data(), kMiB, 0, 5), "");
}

TEST_P(SwapStoreTest, InjectedEnospcAndShortReadsAndTransientErrors) {
  SwapStoreOptions o = options(1);
  o.faults = FaultConfig{};
  auto store = open(o);
  ASSERT_TRUE(store);
  Buffer out = buffer_for(*store, kMiB), in = buffer_for(*store, kMiB);
  strata::testing::fill_stamped(out.data(), kMiB, 0, 6);
  store->faults()->fail_next(IoOp::kWrite, ENOSPC);
  Status s = write_sync(*store, "n", out, kMiB);
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted) << s.to_string();
  // Transient EIO and EAGAIN on the rewrite are retried away.
  store->faults()->fail_next(IoOp::kWrite, EIO, 2);
  store->faults()->fail_next(IoOp::kWrite, EAGAIN, 3);
  ASSERT_TRUE(write_sync(*store, "n", out, kMiB).ok());
  store->faults()->fail_next(IoOp::kRead, EIO);
  ASSERT_TRUE(read_sync(*store, "n", in).ok());
  EXPECT_EQ(strata::testing::check_stamped(in.data(), kMiB, 0, 6), "");
}

// Random faults of every kind over many operations: each operation either
// returns exactly the bytes written or an error; never silently changed data.
TEST_P(SwapStoreTest, RandomFaultSoakNeverReturnsWrongData) {
  uint64_t base_seed = strata::testing::test_seed(33);
  for (uint64_t seed = base_seed; seed < base_seed + 4; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    SwapStoreOptions o = options(2, 64 * kKiB);
    FaultConfig f;
    f.seed = seed;
    f.eio_transient_one_in = 20;
    f.eio_persistent_one_in = 400;
    f.short_transfer_one_in = 10;
    f.enospc_one_in = 300;
    f.eagain_one_in = 25;
    f.latency_one_in = 10;
    f.latency_us = 100;
    f.corrupt_one_in = 200;
    f.reorder = true;
    o.faults = f;
    auto store = open(o);
    ASSERT_TRUE(store);
    std::mt19937_64 rng(seed);
    std::vector<uint64_t> version(8, 0), sizes(8, 0);
    std::vector<bool> valid(8, false);
    int errors = 0, checked = 0;
    for (int step = 0; step < 120; ++step) {
      int b = static_cast<int>(rng() % 8);
      std::string name = "s" + std::to_string(b);
      if (rng() % 2 == 0 || !valid[b]) {
        uint64_t size = sizes[b] != 0 && rng() % 2 ? sizes[b] : 1 + rng() % (700 * kKiB);
        Buffer out = buffer_for(*store, size);
        strata::testing::fill_stamped(out.data(), size, b, seed * 1000 + step);
        Status s = write_sync(*store, name, out, size);
        valid[b] = s.ok();
        if (s.ok()) {
          version[b] = seed * 1000 + step;
          sizes[b] = size;
        } else {
          ++errors;
        }
      } else {
        Buffer in = buffer_for(*store, sizes[b]);
        Status s = read_sync(*store, name, in);
        if (s.ok()) {
          ASSERT_EQ(strata::testing::check_stamped(in.data(), sizes[b], b, version[b]), "") << name;
          ++checked;
        } else {
          ++errors;
          EXPECT_TRUE(s.code() == StatusCode::kDataLoss || s.code() == StatusCode::kUnavailable) << s.to_string();
        }
      }
    }
    EXPECT_GT(checked, 0);
    std::printf("seed %llu: %d verified reads, %d surfaced errors\n", static_cast<unsigned long long>(seed), checked,
                errors);
  }
}

TEST_P(SwapStoreTest, BudgetIsHardAndNamed) {
  SwapStoreOptions o = options(1);
  o.budget_bytes = 2 * kMiB;
  auto store = open(o);
  ASSERT_TRUE(store);
  Buffer out = buffer_for(*store, 2 * kMiB);
  ASSERT_TRUE(write_sync(*store, "a", out, 1536 * kKiB).ok());
  Result<Ticket> t = store->write("b", out.view(), kMiB);
  ASSERT_FALSE(t);
  EXPECT_EQ(t.error().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(t.error().message().find("swap budget of 2.00 MiB"), std::string::npos) << t.error().to_string();
  EXPECT_FALSE(store->contains("b"));
  EXPECT_EQ(store->stats().used_bytes, 1536 * kKiB);
  ASSERT_TRUE(store->remove("a").ok());
  ASSERT_TRUE(write_sync(*store, "b", out, 2 * kMiB).ok());
}

TEST_P(SwapStoreTest, BadInputIsRefusedClearly) {
  SwapStoreOptions o = options(1);
  o.directories.push_back(dir_.path() + "/missing");
  Result<std::unique_ptr<SwapStore>> missing = SwapStore::open(o);
  ASSERT_FALSE(missing);
  EXPECT_EQ(missing.error().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.error().message().find("/missing"), std::string::npos);

  SwapStoreOptions odd = options(1, 12345);
  EXPECT_EQ(SwapStore::open(odd).error().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(SwapStore::open(SwapStoreOptions{}).error().code(), StatusCode::kInvalidArgument);

  auto store = open(options(1));
  ASSERT_TRUE(store);
  Buffer b = buffer_for(*store, 8192);
  Result<Ticket> small = store->write("x", b.view(), 8193);
  ASSERT_FALSE(small);
  EXPECT_EQ(small.error().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(small.error().message().find("smaller than"), std::string::npos);
  IoBuffer shifted{b.data() + 512, 4096};
  EXPECT_EQ(store->write("x", shifted, 100).error().code(), StatusCode::kInvalidArgument);
  EXPECT_FALSE(store->contains("x"));
}

TEST_P(SwapStoreTest, TmpfsDirectoryRefusedUnlessBufferedAllowed) {
  struct statfs fs {};
  if (::statfs("/dev/shm", &fs) != 0 || fs.f_type != TMPFS_MAGIC) GTEST_SKIP() << "/dev/shm is not a tmpfs here";
  strata::testing::TempDir shm("/dev/shm");
  SwapStoreOptions o = options(0);
  o.directories = {shm.path()};
  Result<std::unique_ptr<SwapStore>> refused = SwapStore::open(o);
  ASSERT_FALSE(refused);
  EXPECT_NE(refused.error().message().find("O_DIRECT"), std::string::npos) << refused.error().to_string();
  o.direct = DirectMode::kPrefer;
  auto store = open(o);
  ASSERT_TRUE(store);
  Buffer out = buffer_for(*store, 10000), in = buffer_for(*store, 10000);
  strata::testing::fill_stamped(out.data(), 10000, 0, 7);
  ASSERT_TRUE(write_sync(*store, "t", out, 10000).ok());
  ASSERT_TRUE(read_sync(*store, "t", in).ok());
  EXPECT_EQ(strata::testing::check_stamped(in.data(), 10000, 0, 7), "");
}

// A real full filesystem: a small ext4 image on a loop device.
TEST_P(SwapStoreTest, RealFullDiskIsResourceExhaustedNamingTheFile) {
  strata::testing::SmallDisk disk(dir_.path(), 16 * kMiB);
  if (!disk.skip_reason().empty()) GTEST_SKIP() << disk.skip_reason();
  const std::string& mnt = disk.mount_point();
  SwapStoreOptions o = options(0);
  o.directories = {mnt};
  auto store = open(o);
  ASSERT_TRUE(store);
  Buffer out = buffer_for(*store, 4 * kMiB), in = buffer_for(*store, 4 * kMiB);
  strata::testing::fill_stamped(out.data(), 4 * kMiB, 0, 8);
  Status s;
  int written = 0;
  for (; written < 10 && s.ok(); ++written) s = write_sync(*store, "f" + std::to_string(written), out, 4 * kMiB);
  ASSERT_EQ(s.code(), StatusCode::kResourceExhausted) << s.to_string();
  EXPECT_NE(s.message().find(mnt), std::string::npos) << s.to_string();
  EXPECT_NE(s.message().find("ENOSPC"), std::string::npos) << s.to_string();
  // What was written before the disk filled is intact.
  ASSERT_TRUE(read_sync(*store, "f0", in).ok());
  EXPECT_EQ(strata::testing::check_stamped(in.data(), 4 * kMiB, 0, 8), "");
}

INSTANTIATE_TEST_SUITE_P(Backends, SwapStoreTest, ::testing::Values(Backend::kUring, Backend::kPosix),
                         [](const auto& p) { return std::string(backend_name(p.param)); });

}  // namespace
}  // namespace strata::io
