// The optimizer stage of the step: fp32 master weights and Adam states of
// every chunk, kept in host memory or on NVMe (SwapStore), updated by the CPU
// optimizer, with the new low-precision weights written out for the device.
//
// With states on NVMe the stage is a three-deep pipeline over the chunks:
// while chunk j is updated on the optimizer threads, chunk j+1 is being read
// and chunk j-1 written, through three leased staging buffers — so the step
// costs about the slower of NVMe and CPU, not their sum. Where the bytes
// live never changes what they are: host and NVMe give the same bits
// (tested). A failed read or write ends the step with the error (naming the
// chunk); the swap store never serves a half-written chunk as valid.
//
// Per chunk the state is one blob: [master fp32 | m fp32 | v fp32], n each.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "cpu_optim/optimizer.h"
#include "engine/pinned_arena.h"
#include "engine/plan.h"
#include "engine/trace.h"
#include "io/swap_store.h"

namespace strata::engine {

struct ChunkGrad {
  const void* data = nullptr;  // n elements of `dtype`
  DType dtype = DType::kBF16;
};

struct StageCounters {
  uint64_t nvme_bytes_read = 0;
  uint64_t nvme_bytes_written = 0;
  int64_t nonfinite = 0;  // gradient elements that were inf/nan (kReportOnly: caller rolls back)
  double seconds = 0;
};

class OptimizerStage {
 public:
  // `chunk_elems`: elements per chunk (model_layout order). States on
  // Tier::kHost or Tier::kNvme; for NVMe, `swap` and `staging` (>= 3 buffers
  // of >= 12 * max chunk bytes, padded to the swap alignment) are required.
  static Result<std::unique_ptr<OptimizerStage>> create(std::vector<int64_t> chunk_elems, Tier tier,
                                                        io::SwapStore* swap, PinnedArena* staging,
                                                        cpu_optim::Executor& executor, Trace* trace = nullptr);

  // Sets chunk c's master weights (m = v = 0).
  Status initialize(size_t chunk, const float* master);

  // One optimizer step t over every chunk: grads[c] in, new weights out[c]
  // (n elements of out_dtype each). `options.nonfinite` should be
  // kReportOnly: the engine decides skipping globally before the stage.
  Result<StageCounters> step(const cpu_optim::OptimizerConfig& config, int64_t t, std::span<const ChunkGrad> grads,
                             std::span<void* const> out, DType out_dtype, const cpu_optim::StepOptions& options);

  // Copies chunk c's master weights into `dst` (n floats), for checks.
  Status read_master(size_t chunk, float* dst);
  // Chunk c's whole state [master | m | v] (3n floats) out of / into the
  // stage, for checkpoints and resume. Through the staging arena on NVMe.
  Status read_state(size_t chunk, float* dst);
  Status write_state(size_t chunk, const float* src);
  size_t chunks() const { return elems_.size(); }
  int64_t chunk_elems(size_t chunk) const { return elems_[chunk]; }

  Tier tier() const { return tier_; }
  static uint64_t state_bytes(int64_t elems) { return 12 * static_cast<uint64_t>(elems); }

 private:
  OptimizerStage() = default;
  std::string blob(size_t chunk) const { return "optimizer-state/chunk-" + std::to_string(chunk); }
  cpu_optim::ParamSpan span_over(float* state, int64_t n, const ChunkGrad& g, void* out, DType out_dtype) const;
  Result<StageCounters> step_nvme(const cpu_optim::OptimizerConfig& config, int64_t t, std::span<const ChunkGrad> grads,
                                  std::span<void* const> out, DType out_dtype, const cpu_optim::StepOptions& options);

  std::vector<int64_t> elems_;
  Tier tier_ = Tier::kHost;
  io::SwapStore* swap_ = nullptr;
  PinnedArena* staging_ = nullptr;
  cpu_optim::Executor* executor_ = nullptr;
  Trace* trace_ = nullptr;
  std::vector<std::vector<float>> host_;  // states on the host tier
};

}  // namespace strata::engine
