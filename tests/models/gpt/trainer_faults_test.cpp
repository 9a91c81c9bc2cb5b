// The trainer under faults: NVMe errors end a step and leave the checkpoint
// intact; a full disk during a save leaves the previous checkpoint and no
// partial files; failed writes while initialising or reads while saving
// end cleanly; a damaged trainer.json is refused; a failed step, restore
// or delayed update changes nothing and the run continues with the same
// numbers.
#include "models/gpt/trainer.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/unique_fd.h"
#include "engine/checkpoint_io.h"
#include "tests/models/gpt/trainer_runs.h"
#include "tests/test_util.h"

namespace strata::engine {
namespace {

using testing::RunLog;
using testing::run_log;
using testing::run;
using testing::tiny;

// Injected NVMe faults (persistent EIO, ENOSPC, a swap file that ends early —
// a short read —, a checksum mismatch) end the step with an error naming
// the chunk; the trainer is then destroyed cleanly;
// the checkpoint written before the fault is intact, and resuming from it
// reproduces the uninterrupted run bit for bit. Short transfers are retried
// and change nothing.
TEST(Trainer, NvmeFaultsEndTheStepAndLeaveTheCheckpointIntact) {
  uint64_t seed = strata::testing::test_seed(107);
  strata::testing::TempDir dir;
  TrainerOptions o = tiny(seed);
  o.states = Tier::kNvme;
  o.io_backend = io::Backend::kPosix;
  o.nvme_paths = {dir.sub("ref")};
  std::vector<float> ref = run(o, 8);
  ASSERT_EQ(ref.size(), 8u);
  o.faults = io::FaultConfig{};
  struct Case {
    std::string name;
    StatusCode code;
    std::function<void(io::SwapStore&)> inject;
  };
  const std::vector<Case> cases = {
      {"eio", StatusCode::kUnavailable,
       [](io::SwapStore& s) {
         auto p = *s.locate("optimizer-state/chunk-2");
         s.faults()->add_bad_range(p[0].file_slot, p[0].file_offset_bytes, 4096);
       }},
      {"enospc", StatusCode::kResourceExhausted,
       [](io::SwapStore& s) { s.faults()->fail_next(io::IoOp::kWrite, ENOSPC, 1); }},
      {"short-read", StatusCode::kDataLoss,
       [](io::SwapStore& s) {
         // The swap file ends 4 KiB into chunk 2's state: every read from
         // there on comes back short (chunk 3's, later in the file, is the
         // first the backward pass asks for).
         auto p = *s.locate("optimizer-state/chunk-2");
         ASSERT_GT(p[0].length_bytes, 4096u);
         s.faults()->end_file_at(p[0].file_slot, p[0].file_offset_bytes + 4096);
       }},
      {"checksum", StatusCode::kDataLoss,
       [](io::SwapStore& s) {
         auto p = *s.locate("optimizer-state/chunk-1");
         s.faults()->corrupt_byte(p[0].file_slot, p[0].file_offset_bytes + 100);
       }},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string ckpt = dir.sub(c.name + "-ckpt");
    {
      TrainerOptions f = o;
      f.nvme_paths = {dir.sub(c.name)};
      Result<std::unique_ptr<Trainer>> tr = Trainer::create(f);
      ASSERT_TRUE(tr) << tr.error().to_string();
      for (int i = 0; i < 4; ++i) {
        Result<float> loss = (*tr)->step();
        ASSERT_TRUE(loss) << loss.error().to_string();
        EXPECT_EQ(*loss, ref[static_cast<size_t>(i)]);
      }
      ASSERT_TRUE((*tr)->save(ckpt).ok());
      c.inject(*(*tr)->swap_store());
      Result<float> bad = (*tr)->step();
      ASSERT_FALSE(bad);
      std::printf("%s: %s\n", c.name.c_str(), bad.error().to_string().c_str());
      EXPECT_EQ(bad.error().code(), c.code) << bad.error().to_string();
      EXPECT_NE(bad.error().to_string().find("chunk"), std::string::npos) << bad.error().to_string();
    }  // destroyed after the failed step
    TrainerOptions g = o;
    g.faults.reset();
    g.nvme_paths = {dir.sub(c.name + "-resume")};
    Result<std::unique_ptr<Trainer>> tr = Trainer::create(g);
    ASSERT_TRUE(tr) << tr.error().to_string();
    Status loaded = (*tr)->load(ckpt);
    ASSERT_TRUE(loaded.ok()) << loaded.to_string();
    for (size_t i = 4; i < 8; ++i) {
      Result<float> loss = (*tr)->step();
      ASSERT_TRUE(loss) << loss.error().to_string();
      EXPECT_EQ(*loss, ref[i]) << "step " << i + 1;
    }
  }
  TrainerOptions shorts = o;
  shorts.faults->short_transfer_one_in = 3;
  shorts.nvme_paths = {dir.sub("short")};
  EXPECT_EQ(run(shorts, 8), ref);
}

// With weights, states and saved activations all on NVMe, a step whose reads fail
// (on the compute's side or the optimizer stage's, whichever comes first)
// ends with the error; the speculative updates it began are never switched
// to, and the same trainer, once the fault is gone, continues exactly as the
// run that never failed.
// Bytes the superuser may still write on the filesystem holding `path`.
uint64_t free_bytes(const std::string& path) {
  struct statvfs fs {};
  EXPECT_EQ(::statvfs(path.c_str(), &fs), 0) << path;
  return static_cast<uint64_t>(fs.f_bfree) * fs.f_frsize;
}

// A checkpoint that does not fit on a real full disk: the save is refused
// naming ENOSPC, its unfinished files are removed (the space comes back), the
// checkpoint before it still loads and continues bit for bit, and the
// trainer goes on and saves again once there is room.
TEST(Trainer, ACheckpointOnAFullDiskFailsLeavingThePreviousOneAndNoPartialFiles) {
  uint64_t seed = strata::testing::test_seed(131);
  strata::testing::TempDir dir;
  strata::testing::SmallDisk disk(dir.path(), 16 << 20);
  if (!disk.skip_reason().empty()) GTEST_SKIP() << disk.skip_reason();
  const std::string ckpt = disk.mount_point() + "/ckpt", ballast = disk.mount_point() + "/ballast";
  const TrainerOptions o = tiny(seed);
  const std::vector<float> ref = run(o, 6);
  ASSERT_EQ(ref.size(), 6u);
  {
    Result<std::unique_ptr<Trainer>> tr = Trainer::create(o);
    ASSERT_TRUE(tr) << tr.error().to_string();
    for (size_t i = 0; i < 2; ++i) ASSERT_EQ(*(*tr)->step(), ref[i]);
    const uint64_t before = free_bytes(disk.mount_point());
    ASSERT_TRUE((*tr)->save(ckpt).ok());
    const uint64_t activation_bytes = before - free_bytes(disk.mount_point());
    ASSERT_GT(activation_bytes, 0u);
    // Fill the disk, then give back half a checkpoint. (statvfs counts the
    // blocks ext4 keeps back for its own metadata as free: only a write that
    // fails tells where the disk ends.)
    {
      strata::UniqueFd fd(::open(ballast.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
      ASSERT_GE(fd.get(), 0);
      off_t size = 0;
      for (off_t piece = 1 << 16; piece >= 4096; piece /= 2) {
        while (::posix_fallocate(fd.get(), size, piece) == 0) size += piece;
      }
      const off_t give_back = static_cast<off_t>(activation_bytes / 2 / 4096 * 4096);
      ASSERT_GT(size, give_back);
      ASSERT_EQ(::ftruncate(fd.get(), size - give_back), 0);
    }
    for (size_t i = 2; i < 4; ++i) ASSERT_EQ(*(*tr)->step(), ref[i]);
    const uint64_t full = free_bytes(disk.mount_point());
    Status s = (*tr)->save(ckpt);
    std::printf("save on a full disk: %s\n", s.to_string().c_str());
    ASSERT_EQ(s.code(), StatusCode::kResourceExhausted) << s.to_string();
    EXPECT_NE(s.message().find("ENOSPC"), std::string::npos) << s.to_string();
    EXPECT_NE(s.message().find(ckpt), std::string::npos) << s.to_string();
    EXPECT_EQ(free_bytes(disk.mount_point()), full);  // the unfinished files are gone
    for (const auto& e : std::filesystem::directory_iterator(ckpt)) {
      EXPECT_FALSE(e.path().string().ends_with(".tmp")) << e.path();
    }
    EXPECT_EQ(*CheckpointDir(ckpt).latest_step(), 2);
    // The trainer goes on, and saves once there is room.
    ASSERT_EQ(*(*tr)->step(), ref[4]);
    ASSERT_EQ(::unlink(ballast.c_str()), 0);
    ASSERT_TRUE((*tr)->save(ckpt).ok());
    EXPECT_EQ(*CheckpointDir(ckpt).latest_step(), 5);
  }
  // The step-5 checkpoint continues bit for bit; so does the step-2 one.
  for (const char* step : {"step-5", "step-2"}) {
    SCOPED_TRACE(step);
    const std::string only = dir.sub(std::string("only-") + step);
    std::filesystem::copy(ckpt + "/" + step, only + "/" + step);
    {
      std::ofstream latest(only + "/latest");
      latest << step << "\n";
    }
    Result<std::unique_ptr<Trainer>> tr = Trainer::create(o);
    ASSERT_TRUE(tr) << tr.error().to_string();
    Status loaded = (*tr)->load(only);
    ASSERT_TRUE(loaded.ok()) << loaded.to_string();
    for (size_t i = std::string(step) == "step-5" ? 5 : 2; i < ref.size(); ++i) {
      Result<float> loss = (*tr)->step();
      ASSERT_TRUE(loss) << loss.error().to_string();
      EXPECT_EQ(*loss, ref[i]) << "step " << i + 1;
    }
  }
}

// A write that fails while create() writes the initial states to NVMe
// (several in flight: the writes go on behind the next chunk's draws) ends
// create() with that error, every write waited for, nothing left behind;
// the same options without the fault then train.
TEST(Trainer, AWriteThatFailsWhileInitialisingEndsCreateCleanly) {
  strata::testing::TempDir dir;
  TrainerOptions o = tiny(strata::testing::test_seed(179));
  o.model.layers = 4;
  o.states = Tier::kNvme;
  o.state_piece_elems = kStatePieceGranule;  // several pieces a chunk: several writes in flight
  o.nvme_paths = {dir.path()};
  for (Tier weights : {Tier::kHost, Tier::kNvme}) {
    for (uint32_t one_in : {1u, 3u, 7u}) {
      SCOPED_TRACE("weights on " + std::string(tier_name(weights)) + ", ENOSPC 1 in " + std::to_string(one_in));
      TrainerOptions f = o;
      f.weights = weights;
      f.stream_weights = weights == Tier::kNvme;
      f.faults = io::FaultConfig{.seed = one_in, .enospc_one_in = one_in};
      Result<std::unique_ptr<Trainer>> tr = Trainer::create(f);
      ASSERT_FALSE(tr);
      EXPECT_EQ(tr.error().code(), StatusCode::kResourceExhausted) << tr.error().to_string();
      EXPECT_NE(tr.error().to_string().find("writing "), std::string::npos) << tr.error().to_string();
    }
  }
  o.faults.reset();
  EXPECT_EQ(run(o, 3).size(), 3u);
}

// A state read that fails while a checkpoint streams the states from NVMe
// (the next pieces' reads in flight behind it) ends save() with that error,
// every read waited for: no unfinished step directory stays, `latest`
// still names the checkpoint before, and the trainer is destroyed cleanly.
TEST(Trainer, AStateReadThatFailsWhileSavingLeavesThePreviousCheckpoint) {
  strata::testing::TempDir dir;
  TrainerOptions o = tiny(strata::testing::test_seed(191));
  o.states = Tier::kNvme;
  o.state_piece_elems = kStatePieceGranule;  // several pieces a chunk: several reads in flight
  o.nvme_paths = {dir.sub("nvme")};
  o.faults = io::FaultConfig{};
  const std::string root = dir.path() + "/ckpt";
  Result<std::unique_ptr<Trainer>> tr = Trainer::create(o);
  ASSERT_TRUE(tr) << tr.error().to_string();
  for (int i = 0; i < 2; ++i) ASSERT_TRUE((*tr)->step());
  ASSERT_TRUE((*tr)->save(root).ok());
  ASSERT_TRUE((*tr)->step());
  const OptimizerStage& stage = (*tr)->optimizer_stage();
  ASSERT_GT(stage.pieces(), 4u);
  io::SwapStore& store = *(*tr)->swap_store();
  auto where = *store.locate(stage.state_blob(stage.pieces() / 2));
  store.faults()->add_bad_range(where[0].file_slot, where[0].file_offset_bytes, 4096);
  Status saved = (*tr)->save(root);
  EXPECT_EQ(saved.code(), StatusCode::kUnavailable) << saved.to_string();
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(root)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{".lock", "latest", "step-2"}));
  EXPECT_EQ(*CheckpointDir(root).latest_step(), 2);
}

// A checkpoint whose trainer.json was edited by hand (a value of the wrong
// type, a key gone, not JSON) is refused with the file named — not an
// exception out of the trainer — and the trainer goes on as it was. A
// sealed record refuses any edit as DataLoss; an unsealed (legacy) one is
// checked key by key.
TEST(Trainer, ADamagedCheckpointDescriptionIsRefusedNotThrown) {
  uint64_t seed = strata::testing::test_seed(167);
  strata::testing::TempDir dir;
  const TrainerOptions o = tiny(seed);
  const std::vector<float> ref = run(o, 3);
  Result<std::unique_ptr<Trainer>> tr = Trainer::create(o);
  ASSERT_TRUE(tr) << tr.error().to_string();
  ASSERT_EQ(*(*tr)->step(), ref[0]);
  const std::string root = dir.path() + "/ckpt";
  ASSERT_TRUE((*tr)->save(root).ok());
  const std::string meta_path = root + "/step-1/trainer.json";
  std::string original;
  {
    std::ifstream in(meta_path);
    original.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  ASSERT_NE(original.find("\"grad_accum\": 1"), std::string::npos) << original;
  struct Case {
    std::string name, text;
    StatusCode code;
  };
  nlohmann::json unsealed = nlohmann::json::parse(original);
  for (const char* key : {"checksum", "format", "files"}) unsealed.erase(key);
  const std::string legacy = unsealed.dump(2);
  std::string wrong_type = original, no_model = original, legacy_wrong_type = legacy, legacy_no_model = legacy;
  const std::string accum = "\"grad_accum\": 1", model = "\"model\"";
  wrong_type.replace(wrong_type.find(accum), accum.size(), "\"grad_accum\": \"one\"");
  no_model.replace(no_model.find(model), model.size(), "\"modell\"");
  legacy_wrong_type.replace(legacy_wrong_type.find(accum), accum.size(), "\"grad_accum\": \"one\"");
  unsealed.erase("model");
  legacy_no_model = unsealed.dump(2);
  const std::vector<Case> cases = {{"wrong type", wrong_type, StatusCode::kDataLoss},
                                   {"no model", no_model, StatusCode::kDataLoss},
                                   {"legacy, wrong type", legacy_wrong_type, StatusCode::kDataLoss},
                                   {"legacy, no model", legacy_no_model, StatusCode::kFailedPrecondition},
                                   {"not JSON", "{\"step\": ", StatusCode::kDataLoss}};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    {
      std::ofstream out(meta_path, std::ios::trunc);
      out << c.text;
    }
    Status s = (*tr)->load(root);
    std::printf("%s: %s\n", c.name.c_str(), s.to_string().c_str());
    EXPECT_EQ(s.code(), c.code) << s.to_string();
    EXPECT_NE(s.message().find(root + "/step-1"), std::string::npos) << s.to_string();
  }
  // Nothing was loaded: the trainer goes on from where it was.
  for (size_t i = 1; i < 3; ++i) EXPECT_EQ(*(*tr)->step(), ref[i]);
}

TEST(Trainer, AFailedStepChangesNothingAndTheTrainerContinues) {
  uint64_t seed = strata::testing::test_seed(113);
  strata::testing::TempDir dir;
  // Weights on NVMe, and in RAM (where the optimizer writes the new weights
  // beside the ones the step computes with, switched to only when the step
  // updates: a forward that fails part way, as a failed checkpoint write
  // after block 2 makes it, must leave the weights the step began with).
  // Also in the vertical order, whose checkpoint blobs hold two
  // micro-batches' block inputs each.
  for (int variant = 0; variant < 3; ++variant) {
    const Tier weights = variant == 1 ? Tier::kHost : Tier::kNvme;
    const bool vertical = variant == 2;
    SCOPED_TRACE(std::string(weights == Tier::kNvme ? "weights on nvme" : "weights in ram") +
                 (vertical ? ", vertical order of 2 micro-batches" : ""));
    TrainerOptions o = tiny(seed);
    o.model.layers = 5;
    o.stream_weights = true;
    o.device_bytes = 8ull << 20;
    o.states = Tier::kNvme;
    o.weights = weights;
    o.activations = Tier::kNvme;
    if (vertical) {
      o.grad_accum = 2;
      o.vertical_accumulation = true;
    }
    const std::string tag = std::to_string(variant);
    o.nvme_paths = {dir.sub("ref" + tag)};
    std::vector<float> ref = run(o, 8);
    ASSERT_EQ(ref.size(), 8u);
    for (io::IoOp op : {io::IoOp::kRead, io::IoOp::kWrite}) {
      SCOPED_TRACE(op == io::IoOp::kRead ? "reads fail" : "writes fail");
      TrainerOptions f = o;
      f.faults = io::FaultConfig{};
      f.nvme_paths = {dir.sub((op == io::IoOp::kRead ? "r" : "w") + tag)};
      auto tr = std::move(Trainer::create(f)).value();
      std::vector<float> losses;
      for (int i = 0; i < 8; ++i) {
        if (i == 3) {
          tr->swap_store()->faults()->fail_next(op, EIO, 1000);
          Result<float> bad = tr->step();
          ASSERT_FALSE(bad);
          EXPECT_EQ(bad.error().code(), StatusCode::kUnavailable) << bad.error().to_string();
          EXPECT_EQ(tr->steps_done(), 3);
          tr->swap_store()->faults()->clear_forced();
        }
        Result<float> loss = tr->step();
        ASSERT_TRUE(loss) << loss.error().to_string();
        losses.push_back(*loss);
      }
      EXPECT_EQ(losses, ref);
    }
  }
  // The optimizer writes the weights in RAM in place, each chunk as its
  // gradient lands: a state write that fails after the first chunks were
  // updated ends the step, and those chunks get their old weights back
  // (from the master weights the failed step left alone).
  TrainerOptions o = tiny(seed);
  o.model.layers = 5;
  o.states = Tier::kNvme;
  o.nvme_paths = {dir.sub("in-place-ref")};
  const std::vector<float> ref = run(o, 8);
  ASSERT_EQ(ref.size(), 8u);
  // Eight steps with the faults `inject` sets failing step 4; the losses of
  // the others, which must be the reference's. `deferred`: the failed step
  // left chunks to put back.
  auto with_failed_step = [&](const std::string& tag, const std::function<void(io::FaultyDevice&)>& inject,
                              bool* deferred) {
    TrainerOptions f = o;
    f.faults = io::FaultConfig{};
    f.nvme_paths = {dir.sub(tag)};
    auto tr = std::move(Trainer::create(f)).value();
    std::vector<float> losses;
    for (int i = 0; i < 8; ++i) {
      if (i == 3) {
        inject(*tr->swap_store()->faults());
        EXPECT_FALSE(tr->step());
        EXPECT_EQ(tr->steps_done(), 3);
        *deferred = tr->chunks_to_restore() > 0;
        tr->swap_store()->faults()->clear_forced();
      }
      Result<float> loss = tr->step();
      EXPECT_TRUE(loss) << loss.error().to_string();
      if (!loss) break;
      EXPECT_EQ(tr->chunks_to_restore(), 0u);
      losses.push_back(*loss);
    }
    return losses;
  };
  bool deferred_once = false;
  for (uint32_t good_writes : {0u, 2u, 4u}) {
    bool deferred = false;
    EXPECT_EQ(with_failed_step("in-place-" + std::to_string(good_writes),
                               [&](io::FaultyDevice& d) { d.fail_next(io::IoOp::kWrite, EIO, 1000, good_writes); },
                               &deferred),
              ref)
        << "state writes that succeed before the failure: " << good_writes;
    EXPECT_FALSE(deferred) << "reads work: the weights are put back at once";
  }
  // Reads failing too, from some point on: the step fails on a read or on a
  // write, and where putting the weights back fails as well the chunks stay
  // marked and the next step puts them back first.
  for (uint32_t good_reads = 0; good_reads < 12; ++good_reads) {
    bool deferred = false;
    EXPECT_EQ(with_failed_step("restore-" + std::to_string(good_reads),
                               [&](io::FaultyDevice& d) {
                                 d.fail_next(io::IoOp::kWrite, EIO, 1000, 2);
                                 d.fail_next(io::IoOp::kRead, EIO, 1000, good_reads);
                               },
                               &deferred),
              ref)
        << "state reads that succeed before the failures: " << good_reads;
    deferred_once = deferred_once || deferred;
  }
  EXPECT_TRUE(deferred_once) << "no case left weights to put back at the next step";
}

// A skipped fp16 step whose speculative in-place weights cannot be put back
// (the read of their master weights fails) fails, and its loss scale stays:
// the scaler had already halved it, so the retry ran at half the scale and
// the run no longer matched one that never failed (found by
// TrainerPlacements.FaultsAtRandomMomentsEndTheirStepAndChangeNothing).
TEST(Trainer, AFailedRestoreAfterAnOverflowLeavesTheLossScale) {
  const uint64_t seed = strata::testing::test_seed(6);
  strata::testing::TempDir dir;
  TrainerOptions o = tiny(seed);
  o.model.layers = 4;
  o.precision = DType::kF16;
  o.loss_scale.initial_power = 24;  // the first steps overflow
  o.loss_scale.window = 3;
  o.loss_scale.hysteresis = 1;
  o.states = Tier::kNvme;
  o.nvme_paths = {dir.sub("ref")};
  const RunLog ref = run_log(o, 4);
  ASSERT_EQ(ref.losses.size(), 4u);
  ASSERT_GT(ref.skipped, 0);
  int restores_failed = 0;
  for (uint32_t good = 0; good < 24; ++good) {
    TrainerOptions f = o;
    f.faults = io::FaultConfig{};
    f.nvme_paths = {dir.sub("f" + std::to_string(good))};
    auto tr = std::move(Trainer::create(f)).value();
    RunLog got;
    for (int i = 0; i < 4; ++i) {
      const double scale = tr->loss_scale();
      got.scales.push_back(scale);
      if (i == 0) tr->swap_store()->faults()->fail_next(io::IoOp::kRead, EIO, 1000, good);
      Result<float> loss = tr->step();
      tr->swap_store()->faults()->clear_forced();
      if (!loss) {
        EXPECT_EQ(tr->loss_scale(), scale) << "reads fail after " << good << ": " << loss.error().to_string();
        EXPECT_EQ(tr->steps_done(), 0);
        if (loss.error().message().find("putting back the weights") != std::string::npos) ++restores_failed;
        loss = tr->step();
      }
      ASSERT_TRUE(loss) << loss.error().to_string();
      got.losses.push_back(*loss);
    }
    EXPECT_EQ(got.losses, ref.losses) << "reads fail after " << good;
    EXPECT_EQ(got.scales, ref.scales) << "reads fail after " << good;
  }
  EXPECT_GT(restores_failed, 0) << "no fault struck the putting back of the weights";
}

// The delayed update through NVMe failures: a step whose forward or
// backward fails (a block input's read or write) leaves the update beside it
// in flight, and an update that fails itself (its state reads or writes)
// is begun again from the same gradients at the retry — either way the
// retried run has the uninterrupted one's numbers. Before, a failed step
// landed the update at once and a failed update was lost.
TEST(Trainer, AFailedDelayedStepOrUpdateIsRetriedWithTheSameNumbers) {
  const uint64_t seed = strata::testing::test_seed(141);
  strata::testing::TempDir dir;
  TrainerOptions o = tiny(seed);
  o.model.layers = 4;
  o.delayed_update = true;
  o.stream_weights = true;
  o.device_bytes = 8ull << 20;
  o.states = Tier::kNvme;
  o.activations = Tier::kNvme;
  o.nvme_paths = {dir.sub("ref")};
  const std::vector<float> ref = run(o, 6);
  ASSERT_EQ(ref.size(), 6u);
  int stage_failures = 0, pass_failures = 0, variant = 0;
  for (io::IoOp op : {io::IoOp::kRead, io::IoOp::kWrite}) {
    for (uint32_t good = 0; good < 12; good += 3) {
      TrainerOptions f = o;
      f.faults = io::FaultConfig{};
      f.nvme_paths = {dir.sub("f" + std::to_string(variant++))};
      auto tr = std::move(Trainer::create(f)).value();
      std::vector<float> losses;
      for (int i = 0; i < 6; ++i) {
        if (i == 2) tr->swap_store()->with_faults([&](io::FaultyDevice& d) { d.fail_next(op, EIO, 1000, good); });
        Result<float> loss = tr->step();
        tr->swap_store()->with_faults([](io::FaultyDevice& d) { d.clear_forced(); });
        for (int retry = 0; !loss && retry < 2; ++retry) {
          EXPECT_EQ(loss.error().code(), StatusCode::kUnavailable) << loss.error().to_string();
          EXPECT_EQ(tr->steps_done(), i);
          const bool stage = loss.error().message().find("optimizer state") != std::string::npos;
          (stage ? stage_failures : pass_failures) += 1;
          // The failed update is background work not yet redone: the
          // asynchronous-error query says so without waiting.
          if (stage) {
            EXPECT_EQ(tr->async_error().code(), StatusCode::kUnavailable);
          }
          loss = tr->step();
        }
        ASSERT_TRUE(loss) << loss.error().to_string();
        losses.push_back(*loss);
      }
      EXPECT_EQ(losses, ref) << io::io_op_name(op) << "s fail after " << good << " good ones";
      // The last update lands with finalize; nothing is left to report.
      EXPECT_TRUE(tr->finalize().ok());
      EXPECT_TRUE(tr->async_error().ok()) << tr->async_error().to_string();
    }
  }
  std::printf("%d failed updates begun again, %d failed forward/backward passes\n", stage_failures, pass_failures);
  EXPECT_GT(stage_failures, 0);
  EXPECT_GT(pass_failures, 0);
}

}  // namespace
}  // namespace strata::engine
