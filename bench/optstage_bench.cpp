// strata-optstagebench: the optimizer stage with its states on NVMe — the
// three-deep read / update / write pipeline over chunks — next to each of
// its parts measured alone in the same run: NVMe reads + writes of every
// chunk's state (no update), and the CPU update of every chunk with the states
// in memory (no I/O). Overlap efficiency = max(parts) / stage time (1.0: the
// pipeline costs only its slowest part); the planner's prediction from the
// parts' measured rates is reported with its error. Ends with one JSON line.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <vector>

#include "bench/bench_util.h"
#include "common/units.h"
#include "cpu_optim/executor.h"
#include "engine/optimizer_stage.h"

namespace strata::bench {
namespace {

using engine::OptimizerStage;

#define STAGE_CHECK(expr) exit_on_error((expr), "strata-optstagebench")

int run(int argc, char** argv) {
  CLI::App app{"strata-optstagebench: NVMe-resident optimizer states, pipelined vs its parts alone"};
  std::string dir = "/tmp";
  int chunks = 24;
  int64_t chunk_params = 8 << 20;
  int reps = 3;
  std::string backend = "auto";
  app.add_option("--dir", dir, "directory for the state files (the NVMe drive)")->capture_default_str();
  app.add_option("--chunks", chunks, "chunks (transformer blocks)")->capture_default_str()->check(CLI::Range(3, 4096));
  app.add_option("--chunk-params", chunk_params, "parameters per chunk")->capture_default_str();
  app.add_option("--reps", reps, "timed repetitions (median kept)")->capture_default_str()->check(CLI::Range(1, 50));
  app.add_option("--backend", backend, "auto, uring, posix")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  Result<io::Backend> be = io::parse_backend(backend);
  STAGE_CHECK(be.status());

  std::vector<int64_t> elems(static_cast<size_t>(chunks), chunk_params);
  const uint64_t state_bytes = OptimizerStage::state_bytes(chunk_params);
  auto executor = std::move(cpu_optim::Executor::create({})).value();
  io::SwapStoreOptions so;
  so.directories = {dir};
  so.device.backend = *be;
  auto swap_r = io::SwapStore::open(so);
  STAGE_CHECK(swap_r.status());
  io::SwapStore& swap = **swap_r;
  io::AlignedAllocator allocator(false);
  auto staging_r = engine::PinnedArena::create("optimizer staging", swap.padded_size(state_bytes), 3, allocator,
                                               executor.get());
  STAGE_CHECK(staging_r.status());
  auto nvme_r = OptimizerStage::create(elems, engine::Tier::kNvme, &swap, staging_r->get(), *executor);
  auto host_r = OptimizerStage::create(elems, engine::Tier::kHost, nullptr, nullptr, *executor);
  STAGE_CHECK(nvme_r.status());
  STAGE_CHECK(host_r.status());
  std::printf("strata-optstagebench: %d chunks x %s params, %s of states on %s (%s), %d threads\n", chunks,
              std::to_string(chunk_params).c_str(), format_bytes(state_bytes * chunks).c_str(), dir.c_str(),
              std::string(swap.backend()).c_str(), executor->threads());
  std::vector<float> init(static_cast<size_t>(chunk_params), 0.5f);
  for (int c = 0; c < chunks; ++c) {
    STAGE_CHECK((*nvme_r)->initialize(static_cast<size_t>(c), init.data()));
    STAGE_CHECK((*host_r)->initialize(static_cast<size_t>(c), init.data()));
  }
  std::vector<uint16_t> grad(static_cast<size_t>(chunk_params), f32_to_bf16(0.001f));
  std::vector<std::vector<uint16_t>> out(static_cast<size_t>(chunks), std::vector<uint16_t>(grad.size()));
  std::vector<engine::ChunkGrad> grads(static_cast<size_t>(chunks), {grad.data(), DType::kBF16});
  std::vector<void*> outs;
  for (auto& o : out) outs.push_back(o.data());
  cpu_optim::AdamConfig adamw;
  cpu_optim::StepOptions opts;
  opts.nonfinite = cpu_optim::NonFinitePolicy::kReportOnly;
  int64_t t = 0;

  // Part 1: CPU update alone (states in memory).
  double update_s = median_seconds(reps, [&] { STAGE_CHECK((*host_r)->step(adamw, ++t, grads, outs, DType::kBF16, opts).status()); });
  // Part 2: NVMe alone: the stage's own schedule (read chunk j+1 and write
  // chunk j-1 around chunk j, three buffers) with the update left out.
  double io_s = median_seconds(reps, [&] {
    std::vector<engine::PinnedArena::Lease> leases(static_cast<size_t>(chunks));
    std::vector<std::optional<io::Ticket>> reads(static_cast<size_t>(chunks)), writes(static_cast<size_t>(chunks));
    auto name = [](int c) { return "optimizer-state/chunk-" + std::to_string(c); };
    auto issue_read = [&](int c) {
      leases[c] = std::move((*staging_r)->acquire("io-only part")).value();
      auto r = swap.read(name(c), leases[c].buffer());
      STAGE_CHECK(r.status());
      reads[c] = *r;
    };
    issue_read(0);
    for (int c = 0; c < chunks; ++c) {
      if (c + 1 < chunks) {
        if (c >= 2) {
          STAGE_CHECK(swap.wait(*writes[c - 2]));
          writes[c - 2].reset();
          leases[c - 2] = engine::PinnedArena::Lease();
        }
        issue_read(c + 1);
      }
      STAGE_CHECK(swap.wait(*reads[c]));
      auto w = swap.write(name(c), leases[c].buffer(), state_bytes);
      STAGE_CHECK(w.status());
      writes[c] = *w;
    }
    for (int c = 0; c < chunks; ++c) {
      if (writes[c]) STAGE_CHECK(swap.wait(*writes[c]));
    }
  });
  // The pipelined stage.
  double stage_s = median_seconds(reps, [&] { STAGE_CHECK((*nvme_r)->step(adamw, ++t, grads, outs, DType::kBF16, opts).status()); });

  const double total_state = static_cast<double>(state_bytes) * chunks;
  const double io_gbps = 2 * total_state / io_s / 1e9;
  const double parts_max = std::max(update_s, io_s);
  const double overlap = parts_max / stage_s;
  // The planner's model: the stage costs its slowest link (reads and writes
  // share the drive, so they add), at the rates just measured.
  const double predicted = std::max(update_s, io_s);
  const double prediction_error = (stage_s - predicted) / predicted;
  std::printf("%-34s %10s\n", "part", "seconds");
  std::printf("%-34s %10.3f\n", "cpu update alone (states in RAM)", update_s);
  std::printf("%-34s %10.3f   (%.2f GB/s read+write)\n", "nvme read+write alone", io_s, io_gbps);
  std::printf("%-34s %10.3f\n", "pipelined stage", stage_s);
  std::printf("overlap efficiency max(parts)/stage: %.3f, prediction error: %+.3f\n", overlap, prediction_error);
  nlohmann::json j = {{"bench", "optimizer_stage"}, {"chunks", chunks}, {"chunk_params", chunk_params},
                      {"step_s", stage_s}, {"parts", {{"cpu_update", update_s}, {"nvme_read_write", io_s}}},
                      {"overlap_efficiency", overlap}, {"predicted_s", predicted},
                      {"prediction_error", prediction_error}, {"io_backend", std::string(swap.backend())},
                      {"system", system_info()}};
  std::printf("%s\n", j.dump().c_str());
  return 0;
}

}  // namespace
}  // namespace strata::bench

int main(int argc, char** argv) { return strata::bench::run(argc, argv); }
