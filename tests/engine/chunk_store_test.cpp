// The chunk store: each view's residency state through its transitions
// (weights NVMe -> host -> device and back home when their slot is reused;
// a gradient dirty -> copying -> on host), reference-counted slots that a
// held use keeps, the recorded order prefetched depth uses ahead, and the
// bytes that arrive — on the host backend with a capped device.
#include "engine/chunk_store.h"

#include <gtest/gtest.h>

#include <cstring>
#include <thread>
#include <vector>

#include "common/dtype.h"
#include "cpu_optim/executor.h"
#include "engine/optimizer_stage.h"
#include "models/gpt/gpt_config.h"
#include "gpu/host/host_device.h"
#include "tests/test_util.h"

namespace strata::engine {
namespace {

struct Rig {
  gpt::GptConfig config;
  std::vector<gpt::ChunkLayout> layout;
  std::unique_ptr<gpu::HostDevice> device;
  gpu::Stream copy{};
  WaitMeter meter;
  std::unique_ptr<ChunkStore> store;
  std::vector<std::vector<std::byte>> host;  // each chunk's weights (bf16), stamped
  std::vector<const void*> weights;

  explicit Rig(int depth = 1, Tier states = Tier::kHost, uint64_t device_bytes = 8 << 20) {
    config.layers = 4, config.hidden = 32, config.heads = 4, config.vocab = 41, config.max_seq = 8;
    layout = gpt::model_layout(config);
    Result<std::unique_ptr<gpu::HostDevice>> d = gpu::HostDevice::create({.capacity_bytes = device_bytes});
    EXPECT_TRUE(d);
    device = std::move(*d);
    copy = *device->create_stream("copy");
    for (size_t c = 0; c < layout.size(); ++c) {
      host.emplace_back(static_cast<size_t>(layout[c].numel) * 2);
      strata::testing::fill_stamped(host.back().data(), host.back().size(), c << 32, 77);
      weights.push_back(host.back().data());
    }
    ChunkStoreOptions o;
    o.prefetch_depth = depth;
    o.dtype = DType::kBF16;
    o.states = states;
    std::vector<int64_t> elems;
    for (const gpt::ChunkLayout& chunk : layout) elems.push_back(chunk.numel);
    Result<std::unique_ptr<ChunkStore>> s = ChunkStore::create(elems, *device, copy, &meter, o);
    if (s) {
      store = std::move(*s);
    } else {
      error = s.error();
    }
  }
  // The device bytes at `data` equal chunk c's host weights.
  std::string check(size_t c, const void* data) {
    std::vector<std::byte> back(host[c].size());
    Status s = device->copy_to_host(copy, back.data(), data, back.size());
    if (s.ok()) s = device->synchronize(copy);
    if (!s.ok()) return s.to_string();
    return strata::testing::check_stamped(back.data(), back.size(), c << 32, 77);
  }
  Residency at(size_t c) const { return store->residency(c, View::kWeights); }
  Status error;
};

// A swap store in `dir`, on io_uring where this machine allows it.
Result<std::unique_ptr<io::SwapStore>> open_swap(const strata::testing::TempDir& dir) {
  io::SwapStoreOptions o;
  o.directories = {dir.path()};
  std::string why;
  o.device.backend = strata::testing::uring_available(&why) ? io::Backend::kUring : io::Backend::kPosix;
  return io::SwapStore::open(o);
}

// Forward: blocks 1..L, the final chunk; backward: the final chunk, blocks L..1.
std::vector<size_t> step_order(int64_t L) {
  std::vector<size_t> order;
  for (int64_t l = 1; l <= L + 1; ++l) order.push_back(static_cast<size_t>(l));
  for (int64_t l = L + 1; l >= 1; --l) order.push_back(static_cast<size_t>(l));
  return order;
}

// One step's uses in order, each checked for its bytes and state.
void run_step(Rig& r, bool same_weights = false) {
  ASSERT_TRUE(r.store->begin_step(r.weights, same_weights).ok());
  Result<const void*> emb = r.store->resident_weights();
  ASSERT_TRUE(emb);
  EXPECT_EQ(r.check(0, *emb), "");
  EXPECT_EQ(r.at(0), Residency::kOnDevice);
  for (size_t c : step_order(r.config.layers)) {
    Result<ChunkStore::Use> u = r.store->acquire(c);
    ASSERT_TRUE(u) << u.error().to_string();
    EXPECT_EQ(r.at(c), Residency::kOnDevice) << "chunk " << c;
    EXPECT_EQ(r.check(c, u->data), "") << "chunk " << c << " at position " << u->position;
    r.store->release(*u);
  }
  r.store->end_step();
}

TEST(ChunkStore, WeightsComeUpAheadAndGoHomeWhenTheirSlotIsReused) {
  Rig r(/*depth=*/1);
  ASSERT_TRUE(r.store) << r.error.to_string();
  for (size_t c = 0; c < r.layout.size(); ++c) {
    EXPECT_EQ(r.at(c), Residency::kOnHost);
    EXPECT_EQ(r.store->home(c, View::kWeights), Tier::kHost);
    EXPECT_EQ(r.store->home(c, View::kMaster), Tier::kHost);
  }
  // The first step records the order, fetching each use on demand.
  ASSERT_TRUE(r.store->begin_step(r.weights).ok());
  EXPECT_EQ(r.at(0), Residency::kCopying) << "chunk 0's copy is issued by begin_step";
  EXPECT_EQ(r.at(1), Residency::kOnHost) << "nothing is predicted while recording";
  r.store->drain();
  run_step(r);
  ASSERT_TRUE(r.store->schedule().replaying());
  EXPECT_EQ(r.store->schedule().order(), step_order(r.config.layers));

  // A replayed step: begin_step issues positions 0 and 1 (depth 1).
  ASSERT_TRUE(r.store->begin_step(r.weights).ok());
  EXPECT_NE(r.at(1), Residency::kOnHost);
  EXPECT_NE(r.at(2), Residency::kOnHost);
  EXPECT_EQ(r.at(3), Residency::kOnHost);
  Result<const void*> emb = r.store->resident_weights();
  ASSERT_TRUE(emb);
  Result<ChunkStore::Use> u1 = r.store->acquire(1);
  ASSERT_TRUE(u1);
  EXPECT_EQ(r.at(1), Residency::kOnDevice);
  r.store->release(*u1);
  // Chunk 2's use fetches chunk 3 ahead into chunk 1's slot, which nobody
  // references any more: chunk 1's device copy is gone.
  Result<ChunkStore::Use> u2 = r.store->acquire(2);
  ASSERT_TRUE(u2);
  EXPECT_EQ(r.check(2, u2->data), "");
  EXPECT_EQ(r.at(1), Residency::kOnHost);
  EXPECT_NE(r.at(3), Residency::kOnHost);
  r.store->release(*u2);
  r.store->drain();
  for (size_t c = 0; c < r.layout.size(); ++c) EXPECT_EQ(r.at(c), Residency::kOnHost) << "chunk " << c;
  // And a whole replayed step serves the right bytes everywhere.
  run_step(r);
  EXPECT_EQ(r.store->schedule().deviations(), 0u);
  EXPECT_GT(r.store->slot_hits(), 0u) << "the final chunk's second use finds it in its slot";
}

// Another pass over the same weights (the next micro-batch of a step) uses
// what the last complete pass left on the device: a resident store copies
// nothing, a streamed one keeps the embedding and the blocks backward left
// in its slots — and every use still serves the right bytes. After a pass
// that did not end (a failed step) nothing is kept.
TEST(ChunkStore, APassOverTheSameWeightsUsesWhatIsOnTheDevice) {
  for (int depth : {1, 2, 5}) {  // 5: a slot for every chunk (resident)
    SCOPED_TRACE("depth " + std::to_string(depth));
    Rig r(depth);
    ASSERT_TRUE(r.store) << r.error.to_string();
    run_step(r);  // records the order
    const uint64_t b0 = r.store->bytes_to_device();
    run_step(r);
    const uint64_t fresh = r.store->bytes_to_device() - b0;
    run_step(r, /*same_weights=*/true);
    const uint64_t again = r.store->bytes_to_device() - b0 - fresh;
    uint64_t kept = static_cast<uint64_t>(r.layout[0].numel) * 2;  // the embedding
    const int64_t L = r.config.layers;
    const int64_t slots = std::min<int64_t>(depth + 1, L + 1);
    for (int64_t l = 1; l <= std::min(slots, L); ++l)
      kept += static_cast<uint64_t>(r.layout[static_cast<size_t>(l)].numel) * 2;
    if (slots == L + 1) kept += static_cast<uint64_t>(r.layout.back().numel) * 2;
    EXPECT_EQ(again, fresh - kept) << "fresh " << fresh << ", again " << again;
    if (depth == 5) {
      EXPECT_EQ(again, 0u);
    }
    // A pass that did not end keeps nothing.
    ASSERT_TRUE(r.store->begin_step(r.weights).ok());
    Result<ChunkStore::Use> u = r.store->acquire(1);
    ASSERT_TRUE(u);
    r.store->release(*u);
    r.store->drain();
    const uint64_t b1 = r.store->bytes_to_device();
    run_step(r, /*same_weights=*/true);
    EXPECT_EQ(r.store->bytes_to_device() - b1, fresh) << "after an unfinished pass, everything is copied again";
  }
}

TEST(ChunkStore, AReferencedSlotIsNeverReused) {
  Rig r(/*depth=*/1);  // two weight slots
  ASSERT_TRUE(r.store) << r.error.to_string();
  run_step(r);  // records the order
  ASSERT_TRUE(r.store->begin_step(r.weights).ok());
  Result<ChunkStore::Use> a = r.store->acquire(1);
  ASSERT_TRUE(a);
  // Holding chunk 1 and taking chunk 2: the prefetch of chunk 3 has no free
  // slot and waits; chunk 1's bytes are untouched.
  Result<ChunkStore::Use> b = r.store->acquire(2);
  ASSERT_TRUE(b) << b.error().to_string();
  EXPECT_EQ(r.at(3), Residency::kOnHost) << "no slot was free to fetch it into";
  EXPECT_EQ(r.check(1, a->data), "");
  EXPECT_EQ(r.check(2, b->data), "");
  // A third use while both are held: no slot, a clear error.
  Result<ChunkStore::Use> c = r.store->acquire(3);
  ASSERT_FALSE(c);
  EXPECT_EQ(c.error().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(c.error().message().find("release a use"), std::string::npos) << c.error().to_string();
  EXPECT_EQ(r.check(1, a->data), "") << "a referenced slot was overwritten";
  // After the failed step, the next one starts clean.
  r.store->drain();
  run_step(r);
}

TEST(ChunkStore, ReleasingAUseLetsThePrefetchGoOn) {
  Rig r(/*depth=*/2);  // three slots
  ASSERT_TRUE(r.store) << r.error.to_string();
  run_step(r);
  ASSERT_TRUE(r.store->begin_step(r.weights).ok());
  Result<ChunkStore::Use> a = r.store->acquire(1);
  ASSERT_TRUE(a);
  Result<ChunkStore::Use> b = r.store->acquire(2);  // would fetch 3 and 4; one slot free
  ASSERT_TRUE(b);
  EXPECT_NE(r.at(3), Residency::kOnHost);
  EXPECT_EQ(r.at(4), Residency::kOnHost);
  r.store->release(*a);
  r.store->release(*b);
  Result<ChunkStore::Use> c = r.store->acquire(3);  // now 4 and 5 go into the released slots
  ASSERT_TRUE(c);
  EXPECT_NE(r.at(4), Residency::kOnHost);
  EXPECT_NE(r.at(5), Residency::kOnHost);
  EXPECT_EQ(r.at(1), Residency::kOnHost);
  EXPECT_EQ(r.check(3, c->data), "");
  r.store->release(*c);
  r.store->drain();
}

TEST(ChunkStore, AGradientIsDirtyThenCopyingThenOnTheHost) {
  Rig r;
  ASSERT_TRUE(r.store) << r.error.to_string();
  ASSERT_TRUE(r.store->begin_step(r.weights).ok());
  const size_t c = 3;
  EXPECT_EQ(r.store->residency(c, View::kGradient), Residency::kOnHost);
  EXPECT_EQ(r.store->home(c, View::kGradient), Tier::kHost);
  std::vector<std::byte> out(r.host[c].size());
  EXPECT_EQ(r.store->send_gradient(c, out.data()).code(), StatusCode::kFailedPrecondition)
      << "a gradient that was never computed cannot be sent";
  Result<void*> buf = r.store->gradient_buffer(c);
  ASSERT_TRUE(buf);
  EXPECT_EQ(r.store->residency(c, View::kGradient), Residency::kDirty);
  // The "compute": the chunk's stamped bytes written into the device buffer.
  ASSERT_TRUE(r.device->copy_to_device(r.copy, *buf, r.host[c].data(), r.host[c].size()).ok());
  ASSERT_TRUE(r.store->send_gradient(c, out.data()).ok());
  EXPECT_EQ(r.store->residency(c, View::kGradient), Residency::kCopying);
  Status landed;
  std::thread waiter([&] { landed = r.store->await_gradient(c); });  // as the optimizer's thread does
  waiter.join();
  ASSERT_TRUE(landed.ok()) << landed.to_string();
  EXPECT_EQ(r.store->residency(c, View::kGradient), Residency::kOnHost);
  EXPECT_EQ(strata::testing::check_stamped(out.data(), out.size(), c << 32, 77), "");
  r.store->drain();
}

TEST(ChunkStore, WeightsHomedOnNvmeAreLoadedThroughTheHost) {
  strata::testing::TempDir dir;
  Rig r(/*depth=*/1, Tier::kNvme);
  ASSERT_TRUE(r.store) << r.error.to_string();
  Result<std::unique_ptr<io::SwapStore>> swap = open_swap(dir);
  ASSERT_TRUE(swap) << swap.error().to_string();
  auto blob = [](size_t c) { return "weights/chunk-" + std::to_string(c); };
  for (size_t c = 0; c < r.layout.size(); ++c) {
    Result<io::Buffer> b = io::allocate_aligned((*swap)->padded_size(r.host[c].size()));
    ASSERT_TRUE(b);
    std::memcpy(b->data(), r.host[c].data(), r.host[c].size());
    Result<io::Ticket> t = (*swap)->write(blob(c), b->view(), r.host[c].size());
    ASSERT_TRUE(t);
    ASSERT_TRUE((*swap)->wait(*t).ok());
  }
  auto blobs = [&](size_t c) { return std::vector<ChunkStore::BlobPiece>{{blob(c), 0}}; };
  ASSERT_TRUE(r.store->set_nvme_weights({swap->get(), blobs}).ok());
  for (size_t c = 0; c < r.layout.size(); ++c) {
    EXPECT_EQ(r.at(c), Residency::kOnNvme);
    EXPECT_EQ(r.store->home(c, View::kWeights), Tier::kNvme);
    EXPECT_EQ(r.store->home(c, View::kAdamV), Tier::kNvme);
    EXPECT_EQ(r.store->residency(c, View::kAdamM), Residency::kOnNvme);
  }
  const std::vector<const void*> none(r.layout.size(), nullptr);
  r.weights = none;  // the host copies are not used: every byte comes from NVMe
  run_step(r);
  // Replayed: the reads run ahead of the copies (depth + 2 uses).
  ASSERT_TRUE(r.store->begin_step(r.weights).ok());
  EXPECT_NE(r.at(1), Residency::kOnNvme);
  EXPECT_NE(r.at(3), Residency::kOnNvme) << "read ahead of its copy";
  r.store->drain();
  for (size_t c = 0; c < r.layout.size(); ++c) EXPECT_EQ(r.at(c), Residency::kOnNvme) << "chunk " << c;
  run_step(r);
  EXPECT_EQ(r.store->schedule().deviations(), 0u);
}

TEST(ChunkStore, ItsDeviceBuffersComeFromTheBudget) {
  Rig r(/*depth=*/1, Tier::kHost, /*device_bytes=*/16 << 10);
  ASSERT_FALSE(r.store);
  EXPECT_EQ(r.error.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(r.error.message().find("buffer"), std::string::npos) << r.error.to_string();
  Rig ok(/*depth=*/1);
  ASSERT_TRUE(ok.store);
  uint64_t max_chunk = 0;
  for (size_t c = 1; c < ok.layout.size(); ++c) max_chunk = std::max<uint64_t>(max_chunk, ok.layout[c].numel);
  // Two weight slots, two gradient slots, chunk 0's weights and gradient,
  // each rounded up to the device's allocation granule.
  auto granule = [](uint64_t bytes) { return (bytes + 255) / 256 * 256; };
  EXPECT_EQ(ok.device->used_bytes(), 4 * granule(2 * max_chunk) + 2 * granule(2 * static_cast<uint64_t>(ok.layout[0].numel)));

  // The count the planner takes (chunk_store_bytes) is the same, granule
  // included.
  std::vector<int64_t> elems;
  for (const gpt::ChunkLayout& chunk : ok.layout) elems.push_back(chunk.numel);
  ChunkStoreOptions o;
  o.dtype = DType::kBF16;
  const ChunkStoreBytes counted = chunk_store_bytes(elems, o);
  const uint64_t emb = 2 * static_cast<uint64_t>(ok.layout[0].numel);
  EXPECT_EQ(counted.slot, granule(2 * max_chunk));
  EXPECT_EQ(counted.total(), ok.device->used_bytes());
  o.prefetch_depth = 3;
  o.micro_batches = 2;
  EXPECT_EQ(chunk_store_bytes(elems, o).total(), 6 * granule(2 * max_chunk) + granule(emb) + granule(2 * emb));
  o.resident_first = false;  // every chunk through the slots, nothing resident
  EXPECT_EQ(chunk_store_bytes(elems, o).total(), 6 * granule(2 * std::max<uint64_t>(max_chunk, emb / 2)));
}

// A chunk store with an optimizer stage on NVMe reporting to it: chunks of
// `elems` parameters, four staging buffers (one write behind, three read
// ahead), states at 0.5 and bf16 gradients of 0.01 ready in `step`.
struct StagedStore {
  static constexpr uint32_t kBuffers = 4;
  std::unique_ptr<gpu::HostDevice> dev;
  WaitMeter meter;
  std::unique_ptr<ChunkStore> store;
  strata::testing::TempDir dir;
  std::unique_ptr<io::SwapStore> swap;
  io::AlignedAllocator allocator;
  std::unique_ptr<PinnedArena> staging;
  std::unique_ptr<cpu_optim::Executor> executor;
  std::unique_ptr<OptimizerStage> stage;
  std::vector<std::vector<uint16_t>> grads, out;
  OverlapStep step;

  Status open(const std::vector<int64_t>& elems, int64_t piece_elems) {
    STRATA_ASSIGN_OR_RETURN(dev, gpu::HostDevice::create({.capacity_bytes = 1 << 20}));
    ChunkStoreOptions so;
    so.dtype = DType::kBF16;
    so.states = Tier::kNvme;
    STRATA_ASSIGN_OR_RETURN(gpu::Stream copy, dev->create_stream("copy"));
    STRATA_ASSIGN_OR_RETURN(store, ChunkStore::create(elems, *dev, copy, &meter, so));
    STRATA_ASSIGN_OR_RETURN(swap, open_swap(dir));
    const uint64_t buffer = swap->padded_size(OptimizerStage::state_bytes(max_state_piece(elems, piece_elems)));
    STRATA_ASSIGN_OR_RETURN(staging, PinnedArena::create("optimizer staging", buffer, kBuffers, allocator));
    STRATA_ASSIGN_OR_RETURN(executor, cpu_optim::Executor::create({.threads = 1}));
    STRATA_ASSIGN_OR_RETURN(stage, OptimizerStage::create(elems, Tier::kNvme, swap.get(), staging.get(), *executor,
                                                          nullptr, cpu_optim::StateType::kF32, piece_elems));
    for (size_t c = 0; c < elems.size(); ++c) {
      const std::vector<float> master(static_cast<size_t>(elems[c]), 0.5f);
      STRATA_RETURN_IF_ERROR(stage->initialize(c, master.data()));
      grads.emplace_back(static_cast<size_t>(elems[c]), f32_to_bf16(0.01f));
      out.emplace_back(static_cast<size_t>(elems[c]), 0);
      step.grads.push_back({grads.back().data(), DType::kBF16});
      step.out.push_back(out.back().data());
    }
    stage->set_store(store.get());
    step.t = 1;
    step.speculate = true;
    return ok_status();
  }
  ~StagedStore() {
    if (stage) stage->set_store(nullptr);
  }
};

// The optimizer stage moves the master weights and Adam states between NVMe
// and its staging buffers and reports each move: when a chunk's gradient
// is taken (its `ready` runs on the stage's thread), the chunk's states are
// loading, the ones read ahead of it too, those further on still on NVMe,
// and the ones before it updated (dirty) or written back; after the step,
// all are on NVMe again.
TEST(ChunkStore, RecordsTheStatesMovesTheOptimizerStageReports) {
  const std::vector<int64_t> elems = {64, 1000, 5000, 33, 4096, 7, 640};
  StagedStore r;
  Status opened = r.open(elems, /*piece_elems=*/0);
  ASSERT_TRUE(opened.ok()) << opened.to_string();
  ChunkStore* store = r.store.get();
  OptimizerStage* stage = r.stage.get();
  OverlapStep& step = r.step;
  for (size_t c = 0; c < elems.size(); ++c) EXPECT_EQ(store->residency(c, View::kMaster), Residency::kOnNvme);

  for (size_t c = elems.size(); c > 0; --c) step.order.push_back(c - 1);
  const std::vector<size_t> order = step.order;
  // seen[k][j]: chunk order[j]'s master-weights residency as order[k]'s gradient was taken.
  std::vector<std::vector<Residency>> seen(order.size());
  ASSERT_TRUE(stage->begin(step).ok());
  for (size_t k = 0; k < order.size(); ++k) {
    stage->land(order[k], [&, k]() -> Status {
      for (size_t c : order) seen[k].push_back(store->residency(c, View::kMaster));
      return ok_status();
    });
  }
  Result<OverlapOutcome> outcome = stage->finish();
  ASSERT_TRUE(outcome) << outcome.error().to_string();
  ASSERT_FALSE(outcome->rolled_back);
  const size_t ahead = StagedStore::kBuffers - 1;
  for (size_t k = 0; k < order.size(); ++k) {
    ASSERT_EQ(seen[k].size(), order.size());
    for (size_t j = 0; j < order.size(); ++j) {
      const Residency now = seen[k][j];
      if (j < k) {
        EXPECT_TRUE(now == Residency::kDirty || now == Residency::kOnNvme)
            << "taking chunk " << order[k] << ": chunk " << order[j] << " is " << residency_name(now);
      } else if (j < k + ahead) {
        EXPECT_EQ(now, Residency::kLoading) << "taking chunk " << order[k] << ": chunk " << order[j];
      } else {
        EXPECT_EQ(now, Residency::kOnNvme) << "taking chunk " << order[k] << ": chunk " << order[j];
      }
    }
  }
  for (size_t c = 0; c < elems.size(); ++c) {
    EXPECT_EQ(store->residency(c, View::kMaster), Residency::kOnNvme);
    EXPECT_EQ(store->residency(c, View::kAdamV), Residency::kOnNvme);
  }
}

// A chunk bigger than the stage's pieces has a residency per piece: when
// its gradient is taken, the pieces read ahead are loading and the one
// beyond the staging buffers still on NVMe; after the step every piece is
// on NVMe again.
TEST(ChunkStore, RecordsEachPieceOfABigChunksStates) {
  StagedStore r;
  Status opened = r.open({64, 4 * kStatePieceGranule + 5}, kStatePieceGranule);
  ASSERT_TRUE(opened.ok()) << opened.to_string();
  ChunkStore* store = r.store.get();
  OptimizerStage* stage = r.stage.get();
  OverlapStep& step = r.step;
  EXPECT_EQ(store->state_pieces(0), 1u);
  ASSERT_EQ(store->state_pieces(1), 5u);
  step.order = {1, 0};
  std::vector<Residency> seen;
  ASSERT_TRUE(stage->begin(step).ok());
  stage->land(1, [&]() -> Status {
    for (size_t p = 0; p < 5; ++p) seen.push_back(store->residency(1, View::kAdamM, p));
    return ok_status();
  });
  stage->land(0);
  Result<OverlapOutcome> outcome = stage->finish();
  ASSERT_TRUE(outcome) << outcome.error().to_string();
  const std::vector<Residency> want = {Residency::kLoading, Residency::kLoading, Residency::kLoading,
                                       Residency::kOnNvme, Residency::kOnNvme};
  EXPECT_EQ(seen, want);
  for (size_t p = 0; p < 5; ++p) EXPECT_EQ(store->residency(1, View::kMaster, p), Residency::kOnNvme) << p;
  EXPECT_EQ(r.out[1][4 * kStatePieceGranule + 4], r.out[1][0]) << "the last piece updated like the first";
  EXPECT_NE(r.out[1][0], 0);
}

}  // namespace
}  // namespace strata::engine
