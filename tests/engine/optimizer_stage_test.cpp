// The optimizer stage gives the same bits whether the states live in host
// memory or on NVMe (either I/O backend), pipelines more chunks than it has
// staging buffers, and turns NVMe faults into errors naming the chunk.
#include "engine/optimizer_stage.h"

#include <gtest/gtest.h>

#include <cerrno>
#include <cstring>
#include <random>

#include "common/units.h"
#include "cpu_optim/executor.h"
#include "tests/test_util.h"

namespace strata::engine {
namespace {

const std::vector<int64_t> kChunks = {1000, 70001, 5, 4096, 33, 20000, 7};

struct Rig {
  Rig() {
    cpu_optim::ExecutorOptions options;
    options.threads = 2;
    executor = std::move(cpu_optim::Executor::create(options)).value();
  }
  std::unique_ptr<cpu_optim::Executor> executor;
  io::AlignedAllocator allocator;
  std::unique_ptr<io::SwapStore> swap;
  std::unique_ptr<PinnedArena> staging;
  std::unique_ptr<OptimizerStage> stage;
  cpu_optim::StateType states = cpu_optim::StateType::kF32;  // how m and v are stored
  int64_t piece_elems = 0;                                   // NVMe: whole chunks
  uint64_t stripe_bytes = 0;                                 // the swap store's stripe unit (0: its default)

  Status open(Tier tier, const std::string& dir, io::Backend backend, std::optional<io::FaultConfig> faults = {}) {
    if (tier == Tier::kNvme) {
      io::SwapStoreOptions o;
      o.directories = {dir};
      o.device.backend = backend;
      o.faults = faults;
      if (stripe_bytes > 0) o.stripe_unit_bytes = stripe_bytes;
      STRATA_ASSIGN_OR_RETURN(swap, io::SwapStore::open(o));
      const int64_t max_n = max_state_piece(kChunks, piece_elems);
      STRATA_ASSIGN_OR_RETURN(staging, PinnedArena::create("optimizer staging",
                                                           swap->padded_size(OptimizerStage::state_bytes(max_n, states)), 3,
                                                           allocator));
    }
    STRATA_ASSIGN_OR_RETURN(stage, OptimizerStage::create(kChunks, tier, swap.get(), staging.get(), *executor,
                                                          nullptr, states, piece_elems));
    for (size_t c = 0; c < kChunks.size(); ++c) {
      std::vector<float> init(static_cast<size_t>(kChunks[c]));
      std::mt19937 rng(static_cast<uint32_t>(c));
      std::normal_distribution<float> nd(0, 1);
      for (float& x : init) x = nd(rng);
      STRATA_RETURN_IF_ERROR(stage->initialize(c, init.data()));
    }
    return ok_status();
  }

  ~Rig() {
    stage.reset();
    staging.reset();
    swap.reset();
  }
};

// Runs `steps` AdamW steps with seeded bf16 gradients; returns the master
// weights and the last bf16 outputs of every chunk.
Status run(Rig& rig, int steps, uint64_t seed, std::vector<std::vector<float>>* master,
           std::vector<std::vector<uint16_t>>* out) {
  cpu_optim::AdamConfig adamw;
  adamw.weight_decay = 0.1f;
  cpu_optim::StepOptions options;
  options.nonfinite = cpu_optim::NonFinitePolicy::kReportOnly;
  out->assign(kChunks.size(), {});
  std::vector<std::vector<uint16_t>> grads(kChunks.size());
  std::vector<ChunkGrad> g(kChunks.size());
  std::vector<void*> o(kChunks.size());
  for (size_t c = 0; c < kChunks.size(); ++c) {
    grads[c].resize(static_cast<size_t>(kChunks[c]));
    (*out)[c].assign(static_cast<size_t>(kChunks[c]), 0);
    g[c] = {grads[c].data(), DType::kBF16};
    o[c] = (*out)[c].data();
  }
  for (int t = 1; t <= steps; ++t) {
    std::mt19937 rng(static_cast<uint32_t>(seed * 100 + t));
    std::normal_distribution<float> nd(0, 0.01f);
    for (auto& v : grads) {
      for (uint16_t& x : v) x = f32_to_bf16(nd(rng));
    }
    STRATA_ASSIGN_OR_RETURN(StageCounters counters, rig.stage->step(adamw, t, g, o, DType::kBF16, options));
    if (rig.stage->tier() == Tier::kNvme) {
      uint64_t total = 0;
      for (int64_t n : kChunks) {
        for (int64_t piece : state_piece_sizes(n, rig.piece_elems)) total += OptimizerStage::state_bytes(piece, rig.states);
      }
      if (counters.nvme_bytes_read != total || counters.nvme_bytes_written != total) {
        return internal_error("byte counters off");
      }
    }
  }
  master->assign(kChunks.size(), {});
  for (size_t c = 0; c < kChunks.size(); ++c) {
    (*master)[c].resize(static_cast<size_t>(kChunks[c]));
    STRATA_RETURN_IF_ERROR(rig.stage->read_master(c, (*master)[c].data()));
  }
  return ok_status();
}

TEST(OptimizerStage, HostAndNvmeGiveTheSameBits) {
  uint64_t seed = strata::testing::test_seed(91);
  strata::testing::TempDir dir;
  std::vector<std::vector<float>> m_host, m_uring, m_posix;
  std::vector<std::vector<uint16_t>> o_host, o_uring, o_posix;
  {
    Rig host;
    ASSERT_TRUE(host.open(Tier::kHost, "", io::Backend::kAuto).ok());
    ASSERT_TRUE(run(host, 4, seed, &m_host, &o_host).ok());
  }
  {
    std::string why;
    Rig nvme;
    Status s = nvme.open(Tier::kNvme, dir.sub("uring"), strata::testing::uring_available(&why) ? io::Backend::kUring
                                                                                                  : io::Backend::kPosix);
    ASSERT_TRUE(s.ok()) << s.to_string();
    s = run(nvme, 4, seed, &m_uring, &o_uring);
    ASSERT_TRUE(s.ok()) << s.to_string();
  }
  {
    Rig nvme;
    ASSERT_TRUE(nvme.open(Tier::kNvme, dir.sub("posix"), io::Backend::kPosix).ok());
    ASSERT_TRUE(run(nvme, 4, seed, &m_posix, &o_posix).ok());
  }
  // The weights moved, and every placement moved them identically.
  std::vector<float> first(static_cast<size_t>(kChunks[1]));
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0, 1);
  for (float& x : first) x = nd(rng);
  EXPECT_NE(m_host[1], first);
  EXPECT_EQ(m_host, m_uring);
  EXPECT_EQ(m_host, m_posix);
  EXPECT_EQ(o_host, o_uring);
  EXPECT_EQ(o_host, o_posix);
}

// The master weights alone (putting back the weights after a skipped step)
// come from the leading stripe units of each piece's blob: about a third of
// fp32 states' bytes, the same values as the whole state holds.
TEST(OptimizerStage, TheMasterWeightsAloneAreReadWithoutMAndV) {
  strata::testing::TempDir dir;
  Rig rig;
  rig.stripe_bytes = 64 * kKiB;
  Status s = rig.open(Tier::kNvme, dir.path(), io::Backend::kPosix);
  ASSERT_TRUE(s.ok()) << s.to_string();
  auto bytes_read = [&] { return rig.swap->stats().directories[0].bytes_read; };
  const size_t c = 1;
  const uint64_t n = static_cast<uint64_t>(kChunks[c]), whole = OptimizerStage::state_bytes(kChunks[c], rig.states);
  std::vector<float> master(n);
  const uint64_t before = bytes_read();
  ASSERT_TRUE(rig.stage->read_master(c, master.data()).ok());
  const uint64_t read = bytes_read() - before;
  EXPECT_EQ(read, round_up(4 * n, 64 * kKiB)) << "the units holding the master weights, whole";
  EXPECT_LT(3 * read, 2 * whole);
  std::vector<std::byte> state(whole);
  ASSERT_TRUE(rig.stage->read_state(c, state.data()).ok());
  EXPECT_EQ(std::memcmp(state.data(), master.data(), 4 * n), 0);
  EXPECT_EQ(bytes_read() - before - read, rig.swap->padded_size(whole));
}

// A chunk bigger than the stage's pieces is read, updated and written piece
// by piece: the same weights, outputs and state (as read_state gathers it
// for checkpoints) as whole chunks, for every state type; and a state
// written back whole lands in the right pieces.
TEST(OptimizerStage, ChunksInPiecesGiveTheSameBitsAndTheSameState) {
  uint64_t seed = strata::testing::test_seed(93);
  strata::testing::TempDir dir;
  for (cpu_optim::StateType st : {cpu_optim::StateType::kF32, cpu_optim::StateType::kBF16, cpu_optim::StateType::kQ8}) {
    const std::string name(cpu_optim::state_type_name(st));
    std::vector<std::vector<float>> m_whole, m_pieces;
    std::vector<std::vector<uint16_t>> o_whole, o_pieces;
    std::vector<std::vector<std::byte>> state_whole(kChunks.size()), state_pieces(kChunks.size());
    Rig whole;
    whole.states = st;
    ASSERT_TRUE(whole.open(Tier::kHost, "", io::Backend::kAuto).ok());
    ASSERT_TRUE(run(whole, 3, seed, &m_whole, &o_whole).ok());
    Rig pieces;
    pieces.states = st;
    pieces.piece_elems = kStatePieceGranule;
    Status s = pieces.open(Tier::kNvme, dir.sub(name), io::Backend::kPosix);
    ASSERT_TRUE(s.ok()) << s.to_string();
    EXPECT_EQ(pieces.stage->pieces(), 18u + 1 + 1 + 1 + 1 + 5 + 1) << name << ": 70001 and 20000 in pieces of 4096";
    EXPECT_TRUE(pieces.swap->contains("optimizer-state/chunk-1-piece-17")) << name;
    EXPECT_TRUE(pieces.swap->contains("optimizer-state/chunk-3")) << name << ": a chunk in one piece keeps its name";
    s = run(pieces, 3, seed, &m_pieces, &o_pieces);
    ASSERT_TRUE(s.ok()) << s.to_string();
    EXPECT_EQ(m_whole, m_pieces) << name;
    EXPECT_EQ(o_whole, o_pieces) << name;
    for (size_t c = 0; c < kChunks.size(); ++c) {
      const size_t bytes = OptimizerStage::state_bytes(kChunks[c], st);
      state_whole[c].resize(bytes);
      state_pieces[c].resize(bytes);
      ASSERT_TRUE(whole.stage->read_state(c, state_whole[c].data()).ok());
      ASSERT_TRUE(pieces.stage->read_state(c, state_pieces[c].data()).ok());
      EXPECT_EQ(state_whole[c], state_pieces[c]) << name << " chunk " << c;
    }
    // Chunk 1's state put back whole from another run's: the pieces take it.
    std::vector<std::byte> other = state_whole[5];
    other.resize(OptimizerStage::state_bytes(kChunks[1], st));  // any bytes of the right size
    for (size_t i = 0; i < other.size(); ++i) other[i] = state_whole[1][(i * 7919) % other.size()];
    ASSERT_TRUE(pieces.stage->write_state(1, other.data()).ok());
    ASSERT_TRUE(whole.stage->write_state(1, other.data()).ok());
    std::vector<std::byte> back(other.size()), back_whole(other.size());
    ASSERT_TRUE(pieces.stage->read_state(1, back.data()).ok());
    ASSERT_TRUE(whole.stage->read_state(1, back_whole.data()).ok());
    EXPECT_EQ(back, back_whole) << name << ": the arrays, without the padding between them";
  }
}

// bf16 and 8-bit m and v: the blob holds them as stored (StateLayout), and
// host and NVMe still give the same bits — different ones from fp32 states.
TEST(OptimizerStage, LowPrecisionStatesGiveTheSameBitsOnHostAndNvme) {
  uint64_t seed = strata::testing::test_seed(92);
  strata::testing::TempDir dir;
  std::vector<std::vector<float>> m_fp32;
  std::vector<std::vector<uint16_t>> o_fp32;
  {
    Rig fp32;
    ASSERT_TRUE(fp32.open(Tier::kHost, "", io::Backend::kAuto).ok());
    ASSERT_TRUE(run(fp32, 4, seed, &m_fp32, &o_fp32).ok());
  }
  for (cpu_optim::StateType st : {cpu_optim::StateType::kBF16, cpu_optim::StateType::kQ8}) {
    const std::string name(cpu_optim::state_type_name(st));
    std::vector<std::vector<float>> m_host, m_nvme;
    std::vector<std::vector<uint16_t>> o_host, o_nvme;
    {
      Rig host;
      host.states = st;
      ASSERT_TRUE(host.open(Tier::kHost, "", io::Backend::kAuto).ok());
      ASSERT_TRUE(run(host, 4, seed, &m_host, &o_host).ok());
      EXPECT_EQ(host.stage->host_bytes(), [&] {
        uint64_t b = 0;
        for (int64_t n : kChunks) b += OptimizerStage::state_bytes(n, st);
        return b;
      }()) << name;
    }
    {
      Rig nvme;
      nvme.states = st;
      Status s = nvme.open(Tier::kNvme, dir.sub(name), io::Backend::kPosix);
      ASSERT_TRUE(s.ok()) << s.to_string();
      s = run(nvme, 4, seed, &m_nvme, &o_nvme);
      ASSERT_TRUE(s.ok()) << s.to_string();
    }
    EXPECT_EQ(m_host, m_nvme) << name;
    EXPECT_EQ(o_host, o_nvme) << name;
    EXPECT_NE(m_host, m_fp32) << name << " states round m and v: the path differs from fp32's";
  }
  // The layout: master, then m and v (8-bit: each followed by its scales),
  // every array on a 64-byte line.
  const StateLayout q8 = StateLayout::of(1000, cpu_optim::StateType::kQ8);
  EXPECT_EQ(q8.m, 4000u / 64 * 64 + 64);
  EXPECT_EQ(q8.m_scale, q8.m + 1024);
  EXPECT_EQ(q8.v, q8.m_scale + 64);  // 4 scales
  EXPECT_EQ(q8.bytes, q8.v_scale + 64);
  EXPECT_EQ(q8.scales, 4);
  EXPECT_EQ(StateLayout::of(1000, cpu_optim::StateType::kBF16).scales, 0);
  EXPECT_EQ(OptimizerStage::state_bytes(1024), 12u * 1024) << "fp32 states: 12 bytes per parameter, no padding";
}

TEST(OptimizerStage, NvmeFaultsEndTheStepWithTheChunkNamed) {
  strata::testing::TempDir dir;
  Rig rig;
  ASSERT_TRUE(rig.open(Tier::kNvme, dir.path(), io::Backend::kPosix, io::FaultConfig{}).ok());
  std::vector<std::vector<float>> master;
  std::vector<std::vector<uint16_t>> out;
  ASSERT_TRUE(run(rig, 1, 3, &master, &out).ok());
  // Persistent EIO under chunk 3's state: the read fails after retries.
  auto pieces = *rig.swap->locate("optimizer-state/chunk-3");
  rig.swap->faults()->add_bad_range(pieces[0].file_slot, pieces[0].file_offset_bytes, 4096);
  Status s = run(rig, 1, 4, &master, &out);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.to_string();
  EXPECT_NE(s.message().find("chunk 3"), std::string::npos) << s.to_string();
  EXPECT_EQ(rig.staging->in_use(), 0u);  // every buffer came back after the drain
  // A flipped byte in chunk 5's state is caught by the checksum, not used.
  strata::testing::TempDir dir2;
  Rig rig2;
  ASSERT_TRUE(rig2.open(Tier::kNvme, dir2.path(), io::Backend::kPosix, io::FaultConfig{}).ok());
  auto p5 = *rig2.swap->locate("optimizer-state/chunk-5");
  rig2.swap->faults()->corrupt_byte(p5[0].file_slot, p5[0].file_offset_bytes + 100);
  Status c = run(rig2, 1, 5, &master, &out);
  ASSERT_EQ(c.code(), StatusCode::kDataLoss) << c.to_string();
  EXPECT_NE(c.message().find("chunk 5"), std::string::npos) << c.to_string();
}

TEST(OptimizerStage, BadSetupsAreRefused) {
  auto ex = std::move(cpu_optim::Executor::create({1, -1})).value();
  EXPECT_EQ(OptimizerStage::create({}, Tier::kHost, nullptr, nullptr, *ex).error().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(OptimizerStage::create({10}, Tier::kNvme, nullptr, nullptr, *ex).error().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(OptimizerStage::create({10}, Tier::kDevice, nullptr, nullptr, *ex).error().code(),
            StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace strata::engine
