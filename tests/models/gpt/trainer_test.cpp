// The host-backend training loop: the same seed gives the same losses bit for
// bit wherever the states live (RAM, NVMe, either I/O backend), weights
// streamed at any prefetch depth, clipping, low-precision states; the loss
// falls; a resume from step 10 reproduces steps 11-20 bit for bit; bad
// options are refused at creation.
#include "models/gpt/trainer.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <linux/capability.h>
#include <linux/magic.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <span>
#include <thread>
#include <tuple>
#include <vector>

#include "common/unique_fd.h"
#include "engine/checkpoint_io.h"
#include "tests/models/gpt/trainer_runs.h"
#include "tests/test_util.h"

#ifdef STRATA_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace strata::engine {
namespace {

using testing::RunLog;
using testing::run_log;
using testing::files_under;
using testing::run;
using testing::tiny;

TEST(Trainer, SameLossesBitForBitWhereverTheStatesLive) {
  uint64_t seed = strata::testing::test_seed(101);
  strata::testing::TempDir dir;
  std::vector<float> host = run(tiny(seed), 20);
  ASSERT_EQ(host.size(), 20u);
  TrainerOptions posix = tiny(seed);
  posix.states = Tier::kNvme;
  posix.nvme_paths = {dir.sub("posix")};
  posix.io_backend = io::Backend::kPosix;
  EXPECT_EQ(run(posix, 20), host);
  std::string why;
  if (strata::testing::uring_available(&why)) {
    TrainerOptions uring = posix;
    uring.nvme_paths = {dir.sub("uring")};
    uring.io_backend = io::Backend::kUring;
    EXPECT_EQ(run(uring, 20), host);
  }
  // The optimizer's threads and the host memory bound to NUMA node 0 (as on
  // a GPU server, the node nearest the GPU): the same bits.
  TrainerOptions numa = posix;
  numa.nvme_paths = {dir.sub("numa")};
  numa.numa_node = 0;
  EXPECT_EQ(run(numa, 20), host);
  numa.numa_node = 4000;
  Result<std::unique_ptr<Trainer>> none = Trainer::create(numa);
  ASSERT_FALSE(none);
  EXPECT_NE(none.error().message().find("NUMA node 4000"), std::string::npos) << none.error().to_string();
}

// The NVMe store takes the I/O settings it is given (the config's io / aio
// block): stripe unit, queue depth, backend — the same bits; and on a
// filesystem without O_DIRECT (tmpfs) the states go through the page cache
// when io_direct allows it, and are refused, naming the setting, when not.
TEST(Trainer, TheIoSettingsReachTheNvmeStore) {
  uint64_t seed = strata::testing::test_seed(139);
  strata::testing::TempDir dir;
  const std::vector<float> host = run(tiny(seed), 6);
  ASSERT_EQ(host.size(), 6u);
  TrainerOptions o = tiny(seed);
  o.states = Tier::kNvme;
  o.nvme_paths = {dir.sub("a"), dir.sub("b")};
  o.io_backend = io::Backend::kPosix;
  o.io_queue_depth = 4;
  o.io_stripe_unit_bytes = 64 << 10;
  {
    Result<std::unique_ptr<Trainer>> tr = Trainer::create(o);
    ASSERT_TRUE(tr) << tr.error().to_string();
    EXPECT_EQ((*tr)->swap_store()->stripe_unit_bytes(), 64u << 10);
    EXPECT_EQ((*tr)->swap_store()->queue_depth(), 4u);
    EXPECT_EQ((*tr)->swap_store()->backend(), "posix");
  }
  EXPECT_EQ(run(o, 6), host);
  o.io_stripe_unit_bytes = 1000;  // not a multiple of the files' alignment
  Result<std::unique_ptr<Trainer>> odd = Trainer::create(o);
  ASSERT_FALSE(odd);
  EXPECT_NE(odd.error().message().find("stripe unit 1000"), std::string::npos) << odd.error().to_string();

  struct statfs fs {};
  if (::statfs("/dev/shm", &fs) != 0 || fs.f_type != TMPFS_MAGIC) GTEST_SKIP() << "/dev/shm is not a tmpfs here";
  strata::testing::TempDir shm("/dev/shm");
  TrainerOptions t = tiny(seed);
  t.states = Tier::kNvme;
  t.nvme_paths = {shm.path()};
  Result<std::unique_ptr<Trainer>> refused = Trainer::create(t);
  ASSERT_FALSE(refused);
  EXPECT_NE(refused.error().message().find("O_DIRECT"), std::string::npos) << refused.error().to_string();
  EXPECT_NE(refused.error().message().find("\"direct\": \"prefer\""), std::string::npos) << refused.error().to_string();
  t.io_direct = io::DirectMode::kPrefer;
  EXPECT_EQ(run(t, 6), host);
  t.io_direct = io::DirectMode::kOff;
  EXPECT_EQ(run(t, 6), host);
}

// Adam's m and v stored in bf16 or as 8-bit blockwise codes: the same bits
// wherever the states and weights live, a resume at step 10 continues bit
// for bit (the checkpoint keeps the states as stored), the loss falls, and
// the states take the bytes their type says.
TEST(Trainer, LowPrecisionAdamStatesGiveTheSameBitsEverywhereAndResume) {
  uint64_t seed = strata::testing::test_seed(111);
  strata::testing::TempDir dir;
  uint64_t host_bytes[3] = {};
  for (cpu_optim::StateType st : {cpu_optim::StateType::kF32, cpu_optim::StateType::kBF16, cpu_optim::StateType::kQ8}) {
    const std::string name(cpu_optim::state_type_name(st));
    TrainerOptions o = tiny(seed);
    o.adam_states = st;
    std::vector<float> host = run(o, 20);
    ASSERT_EQ(host.size(), 20u);
    EXPECT_LT(host.back(), 0.7f * host.front()) << name;
    {
      auto tr = std::move(Trainer::create(o)).value();
      host_bytes[static_cast<int>(st)] = tr->host_bytes();
    }
    TrainerOptions nvme = o;
    nvme.states = Tier::kNvme;
    nvme.nvme_paths = {dir.sub("nvme-" + name)};
    EXPECT_EQ(run(nvme, 20), host) << name << " states on NVMe";
    TrainerOptions all_nvme = nvme;
    all_nvme.nvme_paths = {dir.sub("all-nvme-" + name)};
    all_nvme.stream_weights = true;
    all_nvme.device_bytes = 8ull << 20;
    all_nvme.weights = Tier::kNvme;
    EXPECT_EQ(run(all_nvme, 20), host) << name << " states and weights on NVMe";
    // The tiny model's blocks (12,704 parameters) in 4 pieces each.
    TrainerOptions pieces = all_nvme;
    pieces.nvme_paths = {dir.sub("pieces-" + name)};
    pieces.state_piece_elems = kStatePieceGranule;
    EXPECT_EQ(run(pieces, 20), host) << name << " states and weights on NVMe, in pieces";
    TrainerOptions ram_spec = o;
    ram_spec.speculate_in_ram = true;
    ram_spec.clip_norm = 0.5f;  // fires on some steps: rollbacks from the second copy
    TrainerOptions ram_plain = o;
    ram_plain.clip_norm = 0.5f;
    EXPECT_EQ(run(ram_spec, 12), run(ram_plain, 12)) << name << " speculation in RAM";

    const std::string root = dir.path() + "/ckpt-" + name;
    {
      auto tr = std::move(Trainer::create(nvme)).value();
      for (int i = 0; i < 10; ++i) ASSERT_TRUE(tr->step());
      ASSERT_TRUE(tr->save(root).ok());
    }
    // Written from pieces on NVMe: the same files, byte for byte.
    {
      pieces.nvme_paths = {dir.sub("pieces-ckpt-" + name)};
      auto tr = std::move(Trainer::create(pieces)).value();
      for (int i = 0; i < 10; ++i) ASSERT_TRUE(tr->step());
      ASSERT_TRUE(tr->save(root + "-pieces").ok());
    }
    EXPECT_GE(files_under(root).size(), 3u) << "weights, optimizer state, trainer.json";
    EXPECT_EQ(files_under(root + "-pieces"), files_under(root)) << name;
    auto resumed = std::move(Trainer::create(o)).value();  // states from NVMe into RAM
    Status s = resumed->load(root);
    ASSERT_TRUE(s.ok()) << s.to_string();
    for (int i = 10; i < 20; ++i) {
      Result<float> loss = resumed->step();
      ASSERT_TRUE(loss);
      EXPECT_EQ(*loss, host[static_cast<size_t>(i)]) << name << ": step " << i + 1 << " after the resume";
    }
  }
  // m and v take 8, 4 and ~2 bytes per parameter: the host memory shrinks by
  // the difference (the chunks' padded sizes; 64-byte array alignment aside).
  const uint64_t params = [] {
    uint64_t n = 0;
    for (const gpt::ChunkLayout& c : gpt::model_layout(tiny(1).model)) n += static_cast<uint64_t>(c.numel);
    return n;
  }();
  const double fp32_to_bf16 = static_cast<double>(host_bytes[0] - host_bytes[1]) / static_cast<double>(params);
  const double fp32_to_q8 = static_cast<double>(host_bytes[0] - host_bytes[2]) / static_cast<double>(params);
  EXPECT_NEAR(fp32_to_bf16, 4.0, 0.05);
  EXPECT_NEAR(fp32_to_q8, 6.0 - 8.0 / 256, 0.1);
}

// Drops CAP_IPC_LOCK from the calling thread's effective set (Linux keeps
// capabilities per thread), so RLIMIT_MEMLOCK binds it even as root.
bool drop_ipc_lock(std::string* why) {
  __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[2] = {};
  if (::syscall(SYS_capget, &header, data) != 0) {
    *why = std::string("capget: ") + std::strerror(errno);
    return false;
  }
  data[0].effective &= ~(1u << CAP_IPC_LOCK);
  if (::syscall(SYS_capset, &header, data) != 0) {
    *why = std::string("capset: ") + std::strerror(errno);
    return false;
  }
  return true;
}

// Locking the staging arenas refused (a 16 KiB RLIMIT_MEMLOCK, no
// CAP_IPC_LOCK): the trainer says so, naming `ulimit -l` and the switch;
// with pin_memory off the same run trains.
TEST(Trainer, RefusedMemoryLockingNamesTheLimitAndTheSwitch) {
  strata::testing::TempDir dir;
  rlimit before{};
  ASSERT_EQ(::getrlimit(RLIMIT_MEMLOCK, &before), 0);
  rlimit small = before;
  small.rlim_cur = std::min<rlim_t>(before.rlim_cur, 16 << 10);
  ASSERT_EQ(::setrlimit(RLIMIT_MEMLOCK, &small), 0);
  std::string why, refused;
  bool dropped = false, enforced = false, unpinned_ok = false;
  std::thread([&] {
    dropped = drop_ipc_lock(&why);
    if (!dropped) return;
    // Is the limit enforced here? (AddressSanitizer turns mlock into a no-op.)
    std::vector<std::byte> probe(256 << 10);
    enforced = ::mlock(probe.data(), probe.size()) != 0;
    if (!enforced) {
      ::munlock(probe.data(), probe.size());
      return;
    }
    TrainerOptions o = tiny(5);
    o.states = Tier::kNvme;
    o.nvme_paths = {dir.sub("locked")};
    Result<std::unique_ptr<Trainer>> tr = Trainer::create(o);
    refused = tr ? std::string() : std::string(tr.error().message());
    o.pin_memory = false;
    o.nvme_paths = {dir.sub("unlocked")};
    Result<std::unique_ptr<Trainer>> plain = Trainer::create(o);
    unpinned_ok = plain && (*plain)->step().has_value();
  }).join();
  ASSERT_EQ(::setrlimit(RLIMIT_MEMLOCK, &before), 0);
  if (!dropped) GTEST_SKIP() << "cannot drop CAP_IPC_LOCK here: " << why;
  if (!enforced) GTEST_SKIP() << "mlock ignores RLIMIT_MEMLOCK in this build (a sanitizer makes it a no-op)";
  ASSERT_FALSE(refused.empty()) << "locked staging memory beyond RLIMIT_MEMLOCK was not refused";
  EXPECT_NE(refused.find("ulimit -l"), std::string::npos) << refused;
  EXPECT_NE(refused.find("pin_memory"), std::string::npos) << refused;
  EXPECT_TRUE(unpinned_ok) << "with pin_memory off the run should not need locked memory";
}

TEST(Trainer, LossFalls) {
  std::vector<float> losses = run(tiny(strata::testing::test_seed(102)), 60);
  ASSERT_EQ(losses.size(), 60u);
  float first = losses.front(), last = losses.back();
  std::printf("loss: step 1 %.4f, step 60 %.4f (uniform: %.4f)\n", first, last, std::log(64.0f));
  EXPECT_NEAR(first, std::log(64.0f), 0.3f);  // an untrained model is near uniform
  EXPECT_LT(last, 0.5f * first);
}

TEST(Trainer, ResumeFromStep10ReproducesSteps11To20) {
  uint64_t seed = strata::testing::test_seed(103);
  strata::testing::TempDir dir;
  const std::vector<std::string> placements = {"host", "nvme", "all-nvme"};
  auto options_for = [&](const std::string& name) {
    TrainerOptions o = tiny(seed);
    o.states = name == "host" ? Tier::kHost : Tier::kNvme;
    if (name == "all-nvme") {  // the weights stream from NVMe too, and the gradients wait there
      o.stream_weights = true;
      o.device_bytes = 8ull << 20;
      o.weights = Tier::kNvme;
      o.gradients = Tier::kNvme;
    }
    return o;
  };
  std::vector<float> first_straight;
  for (const std::string& name : placements) {
    TrainerOptions o = options_for(name);
    o.nvme_paths = {dir.sub("nvme-" + name)};
    std::vector<float> straight = run(o, 20);
    ASSERT_EQ(straight.size(), 20u);
    if (first_straight.empty()) first_straight = straight;
    const std::string root = dir.path() + "/ckpt-" + name;
    {
      auto tr = std::move(Trainer::create(o)).value();
      for (int i = 0; i < 10; ++i) ASSERT_TRUE(tr->step());
      ASSERT_TRUE(tr->save(root).ok());
    }
    // Created with its initial state, or without one for the load to fill
    // (no draws; states on NVMe not written): step() and save() are refused
    // until the load, and the same losses follow.
    for (bool initial_state : {true, false}) {
      SCOPED_TRACE(initial_state ? "with its initial state" : "without an initial state");
      TrainerOptions r = o;
      r.initial_state = initial_state;
      auto resumed = std::move(Trainer::create(r)).value();
      if (!initial_state) {
        if (resumed->swap_store() != nullptr) {
          EXPECT_EQ(resumed->swap_store()->stats().used_bytes, 0u) << "blobs written before the load";
        }
        EXPECT_EQ(resumed->step().error().code(), StatusCode::kFailedPrecondition);
        EXPECT_EQ(resumed->save(dir.path() + "/unset-" + name).code(), StatusCode::kFailedPrecondition);
      }
      Status s = resumed->load(root);
      ASSERT_TRUE(s.ok()) << s.to_string();
      EXPECT_EQ(resumed->steps_done(), 10);
      for (int i = 10; i < 20; ++i) {
        Result<float> loss = resumed->step();
        ASSERT_TRUE(loss);
        EXPECT_EQ(*loss, straight[static_cast<size_t>(i)]) << "step " << i + 1 << " (" << name << ")";
      }
    }
  }
  // A checkpoint is the same whatever tier wrote it: each placement's
  // resumes in each other one (states moved from RAM to NVMe, weights from
  // NVMe to RAM, ...) and goes on with the bits of the run that never
  // stopped.
  for (const std::string& from : placements) {
    for (const std::string& to : placements) {
      if (from == to) continue;
      TrainerOptions r = options_for(to);
      r.nvme_paths = {dir.sub("moved-" + from + "-" + to)};
      r.initial_state = false;
      auto resumed = std::move(Trainer::create(r)).value();
      Status s = resumed->load(dir.path() + "/ckpt-" + from);
      ASSERT_TRUE(s.ok()) << from << " -> " << to << ": " << s.to_string();
      for (int i = 10; i < 20; ++i) {
        Result<float> loss = resumed->step();
        ASSERT_TRUE(loss) << loss.error().to_string();
        EXPECT_EQ(*loss, first_straight[static_cast<size_t>(i)]) << "step " << i + 1 << ", " << from << " -> " << to;
      }
    }
  }
  // A checkpoint of another model is refused, naming both.
  TrainerOptions q8 = tiny(seed);
  q8.adam_states = cpu_optim::StateType::kQ8;
  auto other_states = std::move(Trainer::create(q8)).value();
  Status mismatch = other_states->load(dir.path() + "/ckpt-host");
  EXPECT_EQ(mismatch.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(mismatch.message().find("fp32 Adam states"), std::string::npos) << mismatch.to_string();
  TrainerOptions other = tiny(seed);
  other.model.layers = 3;
  auto tr = std::move(Trainer::create(other)).value();
  Status s = tr->load(dir.path() + "/ckpt-host");
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("layers"), std::string::npos) << s.to_string();
}

// Weights streamed block by block through a capped device, at prefetch depth
// 1 and 4, with states in RAM or on NVMe: the same losses, bit for bit.
TEST(Trainer, StreamedWeightsGiveTheSameBitsAtAnyPrefetchDepth) {
  uint64_t seed = strata::testing::test_seed(104);
  strata::testing::TempDir dir;
  TrainerOptions deeper = tiny(seed);
  deeper.model.layers = 5;
  std::vector<float> resident = run(deeper, 20);
  ASSERT_EQ(resident.size(), 20u);
  for (int depth : {1, 4}) {
    for (Tier states : {Tier::kHost, Tier::kNvme}) {
      for (Tier weights : {Tier::kHost, Tier::kNvme}) {
        if (weights == Tier::kNvme && states != Tier::kNvme) continue;
        for (Tier acts : {Tier::kDevice, Tier::kHost, Tier::kNvme}) {
          TrainerOptions o = tiny(seed);
          o.model.layers = 5;  // so that block inputs leave the device through every buffer
          o.stream_weights = true;
          o.device_bytes = 8ull << 20;
          o.prefetch_depth = depth;
          o.states = states;
          o.weights = weights;
          o.activations = acts;
          o.nvme_paths = {dir.sub("d" + std::to_string(depth) + std::string(tier_name(weights)) +
                                  std::string(tier_name(acts)))};
          EXPECT_EQ(run(o, 20), resident) << "prefetch depth " << depth << ", states on " << tier_name(states)
                                          << ", weights on " << tier_name(weights) << ", saved activations on "
                                          << tier_name(acts);
        }
      }
    }
  }
}

// A stop asked for during a step cancels it before the next block, in
// forward or in backward: step() says Cancelled, and the trainer is as it
// was before the step — its next steps give the uninterrupted run's bits,
// with the states in RAM and on NVMe, weights resident and streamed.
TEST(Trainer, AStopCancelsTheStepInProgressAndTheRunGoesOnBitForBit) {
  const uint64_t seed = strata::testing::test_seed(109);
  strata::testing::TempDir dir;
  TrainerOptions base = tiny(seed);
  base.model.layers = 3;
  const std::vector<float> reference = run(base, 4);
  ASSERT_EQ(reference.size(), 4u);
  const int64_t polls_per_step = 2 * base.model.layers;  // before each block, forward then backward
  int placement = 0;
  for (Tier states : {Tier::kHost, Tier::kNvme}) {
    for (bool streamed : {false, true}) {
      TrainerOptions o = base;
      o.states = states;
      o.stream_weights = streamed;
      if (streamed) o.device_bytes = 8ull << 20;
      o.nvme_paths = {dir.sub("p" + std::to_string(placement++))};
      for (int64_t at = 0; at < polls_per_step; ++at) {
        int64_t polls = 0;
        bool armed = false;
        o.stop = [&] { return armed && polls++ == at; };
        Result<std::unique_ptr<Trainer>> tr = Trainer::create(o);
        ASSERT_TRUE(tr) << tr.error().to_string();
        std::vector<float> losses;
        for (int i = 0; i < 2; ++i) {
          Result<float> loss = (*tr)->step();
          ASSERT_TRUE(loss) << loss.error().to_string();
          losses.push_back(*loss);
        }
        armed = true;  // the third step is cancelled at poll `at`
        Result<float> cancelled = (*tr)->step();
        ASSERT_FALSE(cancelled) << "poll " << at;
        EXPECT_EQ(cancelled.error().code(), StatusCode::kCancelled) << cancelled.error().to_string();
        EXPECT_NE(cancelled.error().message().find(at < base.model.layers ? "forward" : "backward"), std::string::npos)
            << cancelled.error().to_string();
        EXPECT_EQ((*tr)->steps_done(), 2);
        armed = false;
        for (int i = 0; i < 2; ++i) {
          Result<float> loss = (*tr)->step();
          ASSERT_TRUE(loss) << "after the cancelled step: " << loss.error().to_string();
          losses.push_back(*loss);
        }
        EXPECT_EQ(losses, reference) << "states on " << tier_name(states) << (streamed ? ", streamed" : ", resident")
                                     << ", cancelled at poll " << at;
      }
    }
  }
}

// Global-norm clipping set so that it fires on some steps and not others
// gives the same bits in every placement, and does change the run.
TEST(Trainer, ClippingThatFiresOnSomeStepsGivesTheSameBitsEverywhere) {
  uint64_t seed = strata::testing::test_seed(106);
  strata::testing::TempDir dir;
  RunLog free = run_log(tiny(seed), 20);
  ASSERT_EQ(free.norms.size(), 20u);
  EXPECT_EQ(free.clipped, 0);
  EXPECT_EQ(free.skipped, 0);
  std::vector<double> sorted = free.norms;
  std::sort(sorted.begin(), sorted.end());
  TrainerOptions base = tiny(seed);
  base.clip_norm = static_cast<float>(sorted[10]);
  RunLog clipped = run_log(base, 20);
  ASSERT_EQ(clipped.losses.size(), 20u);
  EXPECT_GT(clipped.clipped, 0);
  EXPECT_EQ(clipped.skipped, 0);
  EXPECT_LT(clipped.clipped, 20);
  EXPECT_NE(clipped.losses, free.losses);
  // With speculation (on NVMe, or in RAM with speculate_in_ram) the stage
  // updates chunks during backward, guessing "no clip" after an unclipped
  // step; a wrong guess is rolled back and redone.
  int64_t rollbacks = 0, ram_rollbacks = 0;
  for (int depth : {0, 1, 4}) {
    for (Tier states : {Tier::kHost, Tier::kNvme}) {
      for (bool speculate : {true, false}) {
        if (depth == 0 && states == Tier::kHost && !speculate) continue;  // that is `clipped`
        TrainerOptions o = base;
        o.speculate_in_ram = states == Tier::kHost && speculate;
        o.stream_weights = depth > 0;
        o.device_bytes = depth > 0 ? 8ull << 20 : 0;
        o.prefetch_depth = std::max(depth, 1);
        o.states = states;
        o.speculate = speculate;
        o.staging_buffers = 3 + depth;
        o.nvme_paths = {dir.sub("c" + std::to_string(depth) + (speculate ? "s" : "n"))};
        RunLog r = run_log(o, 20);
        EXPECT_EQ(r.losses, clipped.losses)
            << "prefetch depth " << depth << ", states on " << tier_name(states) << ", speculate " << speculate;
        EXPECT_EQ(r.clipped, clipped.clipped);
        EXPECT_EQ(r.skipped, 0);
        if (speculate) {
          EXPECT_GT(r.rollbacks, 0);
          EXPECT_LE(r.rollbacks, r.clipped);
          (states == Tier::kNvme ? rollbacks : ram_rollbacks) = r.rollbacks;
        } else {
          EXPECT_EQ(r.rollbacks, 0);
        }
      }
    }
  }
  std::printf("clip norm %.4f fired on %d of 20 steps (%lld speculative steps rolled back on NVMe, %lld in RAM); loss "
              "%.4f -> %.4f (unclipped %.4f -> %.4f)\n",
              base.clip_norm, clipped.clipped, static_cast<long long>(rollbacks), static_cast<long long>(ram_rollbacks),
              clipped.losses.front(), clipped.losses.back(), free.losses.front(), free.losses.back());
}

// speculate_in_ram is for states in RAM; on NVMe the speculation's second
// copy is the other blob already. In RAM it costs 12 bytes per parameter.
TEST(Trainer, SpeculationInRamIsForStatesInRamAndCostsASecondCopy) {
  strata::testing::TempDir dir;
  TrainerOptions o = tiny(1);
  o.speculate_in_ram = true;
  o.states = Tier::kNvme;
  o.nvme_paths = {dir.sub("n")};
  Result<std::unique_ptr<Trainer>> bad = Trainer::create(o);
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.error().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.error().message().find("speculate_in_ram"), std::string::npos) << bad.error().to_string();
  TrainerOptions plain = tiny(1), spec = tiny(1);
  spec.speculate_in_ram = true;
  auto a = std::move(Trainer::create(plain)).value();
  auto b = std::move(Trainer::create(spec)).value();
  int64_t elems = 0;  // every chunk's elements (padded a little beyond the parameter count)
  for (const gpt::ChunkLayout& c : gpt::model_layout(plain.model)) elems += c.numel;
  EXPECT_EQ(b->host_bytes() - a->host_bytes(), static_cast<uint64_t>(12 * elems));
}

TEST(Trainer, RefusesABadClipNorm) {
  TrainerOptions o = tiny(1);
  o.clip_norm = -1;
  Result<std::unique_ptr<Trainer>> tr = Trainer::create(o);
  ASSERT_FALSE(tr);
  EXPECT_NE(tr.error().to_string().find("clip_norm"), std::string::npos) << tr.error().to_string();
}

// Adam's hyper-parameters are checked when the trainer is created, before
// anything is allocated or initialised, not at the first step.
TEST(Trainer, RefusesBadAdamHyperParametersAtCreation) {
  TrainerOptions beta = tiny(1), eps = tiny(1), lr = tiny(1);
  beta.adam.beta1 = 1.0f;
  eps.adam.eps = -1e-8f;
  lr.adam.lr = std::nanf("");
  for (const auto& [o, what] : {std::pair{beta, "adam beta1"}, std::pair{eps, "adam eps"}, std::pair{lr, "adam lr"}}) {
    Result<std::unique_ptr<Trainer>> tr = Trainer::create(o);
    ASSERT_FALSE(tr) << what;
    EXPECT_EQ(tr.error().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(tr.error().message().find(what), std::string::npos) << tr.error().to_string();
  }
}

// Where there is no GPU (or no CUDA in the build) creating a trainer on the
// CUDA backend, resident or streamed, is an error that says so.
TEST(Trainer, TheCudaBackendSaysWhenItCannotRun) {
  int gpus = 0;
#ifdef STRATA_HAVE_CUDA
  if (cudaGetDeviceCount(&gpus) != cudaSuccess) gpus = 0;
#endif
  for (bool stream : {false, true}) {
    TrainerOptions o = tiny(1);
    o.backend = TrainerOptions::Backend::kCuda;
    o.stream_weights = stream;
    o.device_bytes = stream ? 8 << 20 : 0;
    Result<std::unique_ptr<Trainer>> tr = Trainer::create(o);
    if (gpus > 0) {
      EXPECT_TRUE(tr) << tr.error().to_string();
    } else {
      ASSERT_FALSE(tr);
      const std::string m(tr.error().message());
      EXPECT_TRUE(m.find("CUDA") != std::string::npos || m.find("cuda") != std::string::npos) << m;
    }
  }
}

// Long work reports its progress chunk by chunk: creation (each chunk's
// initial state placed), a save and a load (each chunk's weights, then each
// chunk's states), each counting up to its total on the calling thread.
TEST(Trainer, ReportsProgressChunkByChunkWhileItInitialisesSavesAndLoads) {
  uint64_t seed = strata::testing::test_seed(137);
  strata::testing::TempDir dir;
  std::vector<std::tuple<std::string, int64_t, int64_t>> calls;
  const std::thread::id caller = std::this_thread::get_id();
  bool other_thread = false;
  for (Tier states : {Tier::kHost, Tier::kNvme}) {
    SCOPED_TRACE(states == Tier::kNvme ? "states on NVMe" : "states in RAM");
    calls.clear();
    TrainerOptions o = tiny(seed);
    o.states = states;
    if (states == Tier::kNvme) o.nvme_paths = {dir.sub("nvme")};
    o.progress = [&](std::string_view what, int64_t done, int64_t total) {
      calls.emplace_back(std::string(what), done, total);
      other_thread = other_thread || std::this_thread::get_id() != caller;
    };
    Result<std::unique_ptr<Trainer>> tr = Trainer::create(o);
    ASSERT_TRUE(tr) << tr.error().to_string();
    ASSERT_TRUE((*tr)->step());
    const std::string ckpt = dir.sub(states == Tier::kNvme ? "ckpt-nvme" : "ckpt-ram");
    ASSERT_TRUE((*tr)->save(ckpt).ok());
    ASSERT_TRUE((*tr)->load(ckpt).ok());
    const int64_t chunks = o.model.layers + 2;  // the embedding, the blocks, the head's chunk
    std::vector<std::tuple<std::string, int64_t, int64_t>> want;
    for (int64_t c = 1; c <= chunks; ++c) want.emplace_back("initialising", c, chunks);
    for (int64_t c = 1; c <= 2 * chunks; ++c) want.emplace_back("saving", c, 2 * chunks);
    // The load first verifies every tensor of both files (the weights', and
    // each chunk's master, m and v), then loads chunk by chunk.
    int64_t tensors = 3 * chunks;
    for (const gpt::ChunkLayout& chunk : gpt::model_layout(o.model)) tensors += static_cast<int64_t>(chunk.tensors.size());
    for (int64_t t = 1; t <= tensors; ++t) want.emplace_back("verifying", t, tensors);
    for (int64_t c = 1; c <= 2 * chunks; ++c) want.emplace_back("loading", c, 2 * chunks);
    EXPECT_EQ(calls, want);
  }
  EXPECT_FALSE(other_thread);
}

// A learning-rate schedule: each update takes lr_at of its step, the run
// differs from the constant rate, and a resume at step 10 continues steps
// 11-20 bit for bit (the rate follows the restored step).
TEST(Trainer, ALearningRateScheduleIsFollowedAndResumes) {
  uint64_t seed = strata::testing::test_seed(149);
  strata::testing::TempDir dir;
  TrainerOptions o = tiny(seed);
  o.lr_schedule.warmup_steps = 5;
  o.lr_schedule.start_lr = 1e-3;
  o.lr_schedule.decay = LrSchedule::Decay::kCosine;
  o.lr_schedule.decay_end_step = 18;
  o.lr_schedule.end_lr = 1e-4;
  std::vector<float> full;
  {
    Result<std::unique_ptr<Trainer>> tr = Trainer::create(o);
    ASSERT_TRUE(tr) << tr.error().to_string();
    for (int64_t step = 1; step <= 20; ++step) {
      Result<float> loss = (*tr)->step();
      ASSERT_TRUE(loss) << loss.error().to_string();
      full.push_back(*loss);
      EXPECT_EQ((*tr)->last_lr(), lr_at(o.lr_schedule, o.adam.lr, step)) << step;
      if (step == 10) {
        ASSERT_TRUE((*tr)->save(dir.sub("ckpt")).ok());
      }
    }
  }
  EXPECT_NE(full, run(tiny(seed), 20));
  Result<std::unique_ptr<Trainer>> tr = Trainer::create(o);
  ASSERT_TRUE(tr) << tr.error().to_string();
  ASSERT_TRUE((*tr)->load(dir.path() + "/ckpt").ok());
  for (size_t i = 10; i < 20; ++i) {
    Result<float> loss = (*tr)->step();
    ASSERT_TRUE(loss) << loss.error().to_string();
    EXPECT_EQ(*loss, full[i]) << "step " << i + 1;
  }
  o.lr_schedule.decay_end_step = 3;  // before the warmup ends
  Result<std::unique_ptr<Trainer>> bad = Trainer::create(o);
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.error().code(), StatusCode::kInvalidArgument);
}

// The host and NVMe budgets are held at run time as the device's is: a
// trainer that needs more host memory than its budget, or more NVMe, is
// refused with the budget named; exactly enough runs.
TEST(Trainer, TheHostAndNvmeBudgetsAreHeld) {
  uint64_t seed = strata::testing::test_seed(157);
  strata::testing::TempDir dir;
  TrainerOptions o = tiny(seed);
  o.states = Tier::kNvme;
  o.nvme_paths = {dir.sub("measure")};
  uint64_t host = 0, nvme = 0;
  {
    Result<std::unique_ptr<Trainer>> tr = Trainer::create(o);
    ASSERT_TRUE(tr) << tr.error().to_string();
    ASSERT_TRUE((*tr)->step());
    host = (*tr)->host_bytes();
    nvme = (*tr)->swap_store()->stats().peak_used_bytes;
  }
  o.host_budget_bytes = host - 1;
  o.nvme_paths = {dir.sub("host-short")};
  Result<std::unique_ptr<Trainer>> short_host = Trainer::create(o);
  ASSERT_FALSE(short_host);
  EXPECT_EQ(short_host.error().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(short_host.error().message().find("budgets.host"), std::string::npos) << short_host.error().to_string();
  o.host_budget_bytes = host;
  o.nvme_budget_bytes = nvme / 2;
  o.nvme_paths = {dir.sub("nvme-short")};
  // The states' first generation is placed by create(), the second (the
  // speculative update's) by the first step: one of them is refused.
  Status nvme_refused;
  if (Result<std::unique_ptr<Trainer>> tr = Trainer::create(o); !tr) {
    nvme_refused = tr.error();
  } else if (Result<float> loss = (*tr)->step(); !loss) {
    nvme_refused = loss.error();
  }
  EXPECT_EQ(nvme_refused.code(), StatusCode::kResourceExhausted) << nvme_refused.to_string();
  // By the planner's count before anything is written (budgets.nvme), or
  // by the swap store as the blob is placed.
  EXPECT_TRUE(nvme_refused.message().find("budgets.nvme") != std::string::npos ||
              nvme_refused.message().find("swap budget of") != std::string::npos)
      << nvme_refused.to_string();
  o.nvme_budget_bytes = nvme;
  o.nvme_paths = {dir.sub("enough")};
  Result<std::unique_ptr<Trainer>> enough = Trainer::create(o);
  ASSERT_TRUE(enough) << enough.error().to_string();
  for (int i = 0; i < 3; ++i) ASSERT_TRUE((*enough)->step());
}

// The initial weights are drawn block by block on the optimizer's threads,
// each block from its own generator: the same weights and states, byte for
// byte in a checkpoint written before the first step, with one optimizer
// thread or all of them (chunks of several 2^16-element blocks).
TEST(Trainer, TheInitialWeightsAreTheSameAtAnyThreadCount) {
  uint64_t seed = strata::testing::test_seed(163);
  strata::testing::TempDir dir;
  TrainerOptions o = tiny(seed);
  o.model.hidden = 128;  // a block's chunk: ~200K parameters, 4 blocks of draws
  o.model.layers = 1;
  ASSERT_GT(gpt::block_layout(o.model, 0).numel, 3 * (int64_t{1} << 16));
  auto initial = [&](const std::string& name) {
    Result<std::unique_ptr<Trainer>> tr = Trainer::create(o);
    EXPECT_TRUE(tr) << tr.error().to_string();
    EXPECT_TRUE(tr && (*tr)->save(dir.path() + "/" + name).ok());
    return files_under(dir.path() + "/" + name + "/step-0");
  };
  o.compute_threads = 0;  // the optimizer's executor: every core
  const std::map<std::string, std::string> all = initial("all");
  ASSERT_EQ(all.size(), 3u);                              // model, optimizer, trainer.json
  o.compute_threads = cpu_optim::hardware_threads() - 1;  // one optimizer thread
  EXPECT_TRUE(initial("one") == all);
  o.seed = seed + 1;
  EXPECT_FALSE(initial("other-seed") == all);
}

// The initial weights are GPT-2's, as a checkpoint of step 0 holds them
// (bf16): biases 0, LayerNorm weights 1, the residual projections
// (c_proj) N(0, 0.02 / sqrt(2L)), every other matrix N(0, 0.02) — each
// tensor's mean, standard deviation, share beyond 2 sigma (4.55% for a
// normal; 0 for a uniform of that sigma), correlation with the next element
// and largest value (5.77 sigma at most from 24 bits of radius).
TEST(Trainer, TheInitialWeightsAreGpt2s) {
  strata::testing::TempDir dir;
  TrainerOptions o = tiny(strata::testing::test_seed(173));
  o.model.hidden = 128, o.model.vocab = 256, o.model.max_seq = 64;  // every matrix >= 8192 elements
  Result<std::unique_ptr<Trainer>> tr = Trainer::create(o);
  ASSERT_TRUE(tr) << tr.error().to_string();
  ASSERT_TRUE((*tr)->save(dir.path()).ok());
  Result<SafetensorsReader> model = SafetensorsReader::open(dir.path() + "/step-0/model.safetensors");
  ASSERT_TRUE(model) << model.error().to_string();
  int matrices = 0, residual = 0;
  for (const TensorInfo& t : model->tensors()) {
    ASSERT_EQ(t.dtype, TensorType::kBF16) << t.name;
    std::vector<uint16_t> raw(t.bytes() / 2);
    ASSERT_TRUE(model->read(t.name, std::as_writable_bytes(std::span(raw))).ok()) << t.name;
    std::vector<double> x(raw.size());
    std::transform(raw.begin(), raw.end(), x.begin(), [](uint16_t h) { return double{bf16_to_f32(h)}; });
    const auto ends_with = [&](std::string_view tail) { return std::string_view(t.name).ends_with(tail); };
    if (ends_with(".bias")) {
      EXPECT_TRUE(std::all_of(x.begin(), x.end(), [](double v) { return v == 0.0; })) << t.name;
      continue;
    }
    if (t.name.find("ln_") != std::string::npos) {
      EXPECT_TRUE(std::all_of(x.begin(), x.end(), [](double v) { return v == 1.0; })) << t.name;
      continue;
    }
    const bool is_residual = ends_with("c_proj.weight");
    const double sigma = is_residual ? 0.02 / std::sqrt(2.0 * static_cast<double>(o.model.layers)) : 0.02;
    const double n = static_cast<double>(x.size());
    double sum = 0, sq = 0, largest = 0, beyond = 0;
    for (double v : x) {
      sum += v, sq += v * v, largest = std::max(largest, std::abs(v));
      beyond += std::abs(v) > 2 * sigma ? 1 : 0;
    }
    const double mean = sum / n, sd = std::sqrt(sq / n - mean * mean);
    double lag = 0;  // neighbours (a Box-Muller pair among them) are independent
    for (size_t i = 0; i + 1 < x.size(); ++i) lag += (x[i] - mean) * (x[i + 1] - mean);
    ASSERT_GE(n, 8192) << t.name;
    EXPECT_NEAR(mean, 0.0, 5 * sigma / std::sqrt(n)) << t.name;
    EXPECT_NEAR(sd / sigma, 1.0, 0.05) << t.name;
    EXPECT_NEAR(beyond / n, 0.0455, 0.012) << t.name;
    EXPECT_NEAR(lag / (n - 1) / (sd * sd), 0.0, 5 / std::sqrt(n)) << t.name;
    EXPECT_LE(largest, 5.78 * sigma * (1 + 1.0 / 256)) << t.name;  // bf16 rounds up by at most 2^-8
    ++matrices;
    residual += is_residual ? 1 : 0;
  }
  EXPECT_EQ(matrices, 2 + 4 * static_cast<int>(o.model.layers));  // wte, wpe; c_attn, c_proj, c_fc, mlp c_proj
  EXPECT_EQ(residual, 2 * static_cast<int>(o.model.layers));
}

}  // namespace
}  // namespace strata::engine
