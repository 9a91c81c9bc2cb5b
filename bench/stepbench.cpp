// strata-stepbench: the offloaded training step (weights streamed through a
// capped device, saved activations on the host, optimizer states on
// NVMe) next to each of its parts measured alone in the same run:
//   compute    the same forward, recompute and backward through the
//              device's ModelOps with every chunk resident (no copies);
//   copies     the step's host<->device bytes through a device of the same kind;
//   optimizer  the optimizer stage's busy time with its states in memory;
//   nvme       reading and writing every chunk's state once (and, with
//              --gradients nvme, writing its gradient).
// Prints overlap efficiency = max(parts) / step and the planner's prediction
// (its model at the link rates just measured) with its error. The host
// backend runs on CPU cores, so its parts share them; `--device cuda` runs
// the step and the compute and copy parts on the first CUDA GPU. The last
// line is JSON.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <thread>
#include <vector>

#include "bench/bench_util.h"
#include "common/unique_fd.h"
#include "common/units.h"
#include "cpu_optim/optimizer.h"
#include "engine/pinned_arena.h"
#include "engine/plan.h"
#include "models/gpt/gpt_config.h"
#include "models/gpt/gpt_ops_factory.h"
#include "gpu/host/host_device.h"
#include "gpu/host/ops.h"
#include "models/gpt/gpt_step.h"
#include "models/gpt/trainer.h"
#ifdef STRATA_HAVE_CUDA
#include "gpu/cuda/cuda_device.h"
#endif

namespace strata::bench {
namespace {

#define STEP_CHECK(expr) exit_on_error((expr), "strata-stepbench")

// A device of the kind the step runs on: the host backend (a budget of
// `bytes`), or the first CUDA GPU.
std::unique_ptr<gpu::Device> make_device(const std::string& kind, uint64_t bytes) {
  if (kind == "cuda") {
#ifdef STRATA_HAVE_CUDA
    gpu::cuda::CudaDeviceOptions o;
    o.capacity_bytes = bytes;
    Result<std::unique_ptr<gpu::cuda::CudaDevice>> d = gpu::cuda::CudaDevice::create(o);
    STEP_CHECK(d.status());
    return std::move(*d);
#else
    STEP_CHECK(unimplemented("this build has no CUDA"));
#endif
  }
  gpu::HostDeviceOptions o;
  o.capacity_bytes = bytes;
  Result<std::unique_ptr<gpu::HostDevice>> d = gpu::HostDevice::create(o);
  STEP_CHECK(d.status());
  return std::move(*d);
}

std::unique_ptr<engine::Trainer> make_trainer(const engine::TrainerOptions& o) {
  Result<std::unique_ptr<engine::Trainer>> tr = engine::Trainer::create(o);
  STEP_CHECK(tr.status());
  return std::move(*tr);
}

int run(int argc, char** argv) {
  CLI::App app{"strata-stepbench: the offloaded step against its parts measured alone"};
  std::string dir = "/tmp/strata-stepbench", trace_path, device = "host";
  int layers = 12, hidden = 256, reps = 5, prefetch = 2;
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  int compute_threads = std::max(1, cores - 1);
  double ratio = 5;
  app.add_option("--dir", dir, "directory for the NVMe state files (O_DIRECT-capable)");
  app.add_option("--layers", layers, "transformer blocks")->check(CLI::Range(1, 4096));
  app.add_option("--hidden", hidden, "hidden size (multiple of 64)")->check(CLI::Range(64, 65536));
  app.add_option("--ratio", ratio, "model states (with fp32 Adam states) / device budget")->check(CLI::Range(1.0, 1e6));
  app.add_option("--prefetch", prefetch, "chunks fetched ahead")->check(CLI::Range(1, 16));
  app.add_option("--trace", trace_path, "write a Chrome-trace JSON of the offloaded steps (opens in Perfetto)");
  app.add_option("--compute-threads", compute_threads,
                 "cores the host backend computes on (the rest run the optimizer and the I/O, as beside a GPU); "
                 "default: all but one")
      ->check(CLI::Range(1, 4096));
  app.add_option("--reps", reps, "timed steps per measurement (median)")->check(CLI::Range(1, 1000));
  app.add_option("--device", device, "the host backend, or the first CUDA GPU (a CUDA build)")
      ->check(CLI::IsMember({"host", "cuda"}));
  std::string states_on = "nvme";
  bool speculate_in_ram = false;
  app.add_option("--states", states_on, "where the optimizer states live: nvme (in --dir) or ram")
      ->check(CLI::IsMember({"nvme", "ram"}));
  app.add_flag("--speculate-in-ram", speculate_in_ram,
               "with --states ram: a second copy of the states, so chunks update as their gradients land");
  std::string gradients_on = "host";
  app.add_option("--gradients", gradients_on,
                 "where the gradients wait for the optimizer: host (a buffer per chunk) or nvme (with --states nvme: "
                 "a ring of three chunk buffers, each gradient written to NVMe as it lands)")
      ->check(CLI::IsMember({"host", "nvme"}));
  std::string adam_states = "fp32";
  app.add_option("--adam-states", adam_states, "how Adam's m and v are stored: fp32, bf16 or q8 (8-bit blockwise)")
      ->check(CLI::IsMember({"fp32", "bf16", "q8"}));
  int64_t sub_group = engine::TrainSetup{}.state_piece_elems;
  app.add_option("--sub-group-size", sub_group,
                 "NVMe states: a chunk read, updated and written in pieces of at most this many parameters "
                 "(0: whole chunks; at least 4096)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 50));
  CLI11_PARSE(app, argc, argv);
  if (Status s = engine::check_state_piece_elems(sub_group); !s.ok()) {
    std::fprintf(stderr, "strata-stepbench: --sub-group-size: %s\n", s.to_string().c_str());
    return 2;
  }
  const bool states_nvme = states_on == "nvme";
  if (speculate_in_ram && states_nvme) {
    std::fprintf(stderr, "strata-stepbench: --speculate-in-ram needs --states ram\n");
    return 2;
  }
  const bool grads_nvme = gradients_on == "nvme";
  if (grads_nvme && !states_nvme) {
    std::fprintf(stderr, "strata-stepbench: --gradients nvme needs --states nvme\n");
    return 2;
  }
  gpu::host::set_compute_threads(compute_threads);  // every part and the step alike

  engine::TrainerOptions base;
  base.model.layers = layers, base.model.hidden = hidden, base.model.heads = hidden / 64;
  base.model.vocab = 512, base.model.max_seq = 64;
  base.batch = 4;
  base.seq = 64;
  base.adam.lr = 1e-4f;
  base.adam_states = *cpu_optim::parse_state_type(adam_states);  // CLI11 checked the name
  base.state_piece_elems = sub_group;
  const int64_t params = gpt::parameter_count(base.model);
  // bf16 weights and gradients, fp32 master weights, m and v as stored; the
  // device budget is a fraction of the fp32-state figure (16 bytes per
  // parameter) whatever the states' type, so the types compare on one device.
  const uint64_t states = static_cast<uint64_t>(
      static_cast<double>(params) * (8.0 + engine::training_setup(base).state_bytes_per_param));
  const uint64_t fp32_states = 16ull * static_cast<uint64_t>(params);

  engine::TrainerOptions full = base;
  full.stream_weights = true;
  full.device_bytes = static_cast<uint64_t>(static_cast<double>(fp32_states) / ratio);
  full.prefetch_depth = prefetch;
  full.activations = engine::Tier::kHost;
  full.states = states_nvme ? engine::Tier::kNvme : engine::Tier::kHost;
  full.speculate_in_ram = speculate_in_ram;
  full.gradients = grads_nvme ? engine::Tier::kNvme : engine::Tier::kHost;
  if (states_nvme) full.nvme_paths = {dir};
  full.backend = device == "cuda" ? engine::TrainerOptions::Backend::kCuda : engine::TrainerOptions::Backend::kHost;
  if (!trace_path.empty()) {  // written after the runs: a wrong path fails now
    exit_on_error(
        check_directory_writable(std::filesystem::path(trace_path).parent_path().string()).with_context("--trace"),
        "strata-stepbench");
  }
  engine::Trace trace(!trace_path.empty());
  if (trace.enabled()) full.trace = &trace;
  const std::string where = states_nvme ? "on NVMe in " + dir + (grads_nvme ? ", the gradients too" : "")
                                         : std::string("in RAM") + (speculate_in_ram ? " (with a second copy)" : "");
  std::printf("strata-stepbench: %d blocks x hidden %d, %.1fM parameters, %s of model states, device budget %s "
              "(1/%.3g), %s Adam states %s; the host device computes on %d of %d cores\n",
              layers, hidden, static_cast<double>(params) / 1e6, format_bytes(states).c_str(),
              format_bytes(full.device_bytes).c_str(), ratio, adam_states.c_str(), where.c_str(), compute_threads,
              cores);
  std::fflush(stdout);

  // Compute alone: the step's forward, then its recompute and backward,
  // through the GPT's ops on the device with every chunk resident (no copies).
  // (All of the GPU's free memory on CUDA; a nominal budget on the host.)
  const std::vector<gpt::ChunkLayout> layout = gpt::model_layout(base.model);
  std::unique_ptr<gpu::Device> cdev = make_device(device, device == "cuda" ? 0 : 64ull << 30);
  // In the step's type: the device computes with the working weights as they are.
  Result<std::unique_ptr<gpt::GptOps>> ops = gpt::make_gpt_ops(*cdev, base.model, full.precision);
  STEP_CHECK(ops.status());
  Result<std::unique_ptr<gpt::GptOps::Workspace>> ws = (*ops)->workspace(base.batch, base.seq);
  STEP_CHECK(ws.status());
  Result<gpt::ModelStep> m = gpt::allocate_model_step(*cdev, **ops, base.batch, base.seq);
  STEP_CHECK(m.status());
  Result<gpu::Stream> cs = cdev->create_stream("compute part");
  STEP_CHECK(cs.status());
  {
    std::mt19937 rng(1);
    std::normal_distribution<float> normal(0.0f, 0.02f);
    for (size_t c = 0; c < layout.size(); ++c) {
      std::vector<float> w(static_cast<size_t>(layout[c].numel));
      for (float& x : w) x = normal(rng);
      std::vector<uint16_t> lp(w.size());
      STEP_CHECK(cpu_optim::convert(w.data(), DType::kF32, lp.data(), full.precision, layout[c].numel));
      STEP_CHECK(cdev->copy_to_device(*cs, m->weights[c].data(), lp.data(), lp.size() * 2));
      STEP_CHECK(cdev->synchronize(*cs));
    }
    std::vector<int32_t> tokens(static_cast<size_t>(base.batch * base.seq)), targets(tokens.size());
    for (size_t i = 0; i < tokens.size(); ++i) {
      tokens[i] = static_cast<int32_t>(i % static_cast<size_t>(base.model.vocab));
      targets[i] = static_cast<int32_t>((i + 1) % static_cast<size_t>(base.model.vocab));
    }
    STEP_CHECK(cdev->copy_to_device(*cs, m->tokens.data(), tokens.data(), tokens.size() * 4));
    STEP_CHECK(cdev->copy_to_device(*cs, m->targets.data(), targets.data(), targets.size() * 4));
    STEP_CHECK(cdev->synchronize(*cs));
  }
  auto compute_once = [&](double* fwd, double* bwd) {
    auto t0 = std::chrono::steady_clock::now();
    STEP_CHECK(gpt::enqueue_model_forward(**ops, *cs, **ws, *m));
    STEP_CHECK(cdev->synchronize(*cs));
    auto t1 = std::chrono::steady_clock::now();
    STEP_CHECK(gpt::enqueue_model_backward(**ops, *cs, **ws, *m, 1.0f));
    STEP_CHECK(cdev->synchronize(*cs));
    auto t2 = std::chrono::steady_clock::now();
    *fwd = std::chrono::duration<double>(t1 - t0).count();
    *bwd = std::chrono::duration<double>(t2 - t1).count();
  };

  // The whole offloaded step, in turns with the compute part: on a shared
  // machine the speed drifts over seconds, and alternating the two keeps
  // the drift out of their ratio.
  std::unique_ptr<engine::Trainer> offloaded = make_trainer(full);
  STEP_CHECK(offloaded->step().status());  // warm-up
  {
    double f = 0, b = 0;
    compute_once(&f, &b);  // warm-up
  }
  uint64_t h2d = 0, d2h = 0, nvme_r = 0, nvme_w = 0;
  double idle = 0;
  std::vector<double> steps, fwds, bwds;
  for (int i = 0; i < reps; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    STEP_CHECK(offloaded->step().status());
    steps.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    h2d = offloaded->last_counters().h2d_bytes, d2h = offloaded->last_counters().d2h_bytes;
    nvme_r = offloaded->last_stage().nvme_bytes_read, nvme_w = offloaded->last_stage().nvme_bytes_written;
    idle = offloaded->last_counters().device_idle_fraction;
    double f = 0, b = 0;
    compute_once(&f, &b);
    fwds.push_back(f);
    bwds.push_back(b);
  }
  STEP_CHECK(cdev->async_error());
  const double step_s = median(steps), fwd_s = median(fwds), bwd_s = median(bwds);
  const double compute_s = fwd_s + bwd_s;
  const uint64_t device_peak = offloaded->device()->peak_bytes();
  // The same placement with the opt-in delayed update (inexact): the
  // optimizer and its NVMe traffic run beside the next step's compute
  // (not with the gradients on NVMe, which the trainer runs exact only).
  double delayed_s = 0;
  if (!grads_nvme) {
    engine::TrainerOptions d = full;
    d.delayed_update = true;
    d.trace = nullptr;
    std::unique_ptr<engine::Trainer> delayed = make_trainer(d);
    STEP_CHECK(delayed->step().status());
    delayed_s = median_seconds(reps, [&] { STEP_CHECK(delayed->step().status()); });
  }
  if (trace.enabled()) {
    STEP_CHECK(trace.write(trace_path));
    std::printf("trace: %s (%zu events)\n", trace_path.c_str(), trace.size());
  }
  std::printf("offloaded step: %.3f s (device peak %s of %s; the compute waited %.1f%% of forward+backward)\n",
              step_s, format_bytes(device_peak).c_str(), format_bytes(full.device_bytes).c_str(), 100 * idle);
  std::fflush(stdout);

  // The optimizer alone: the stage with its states in memory, after backward.
  engine::TrainerOptions in_memory = base;
  in_memory.speculate = false;
  std::unique_ptr<engine::Trainer> resident = make_trainer(in_memory);
  STEP_CHECK(resident->step().status());
  std::vector<double> opt;
  for (int i = 0; i < reps; ++i) {
    STEP_CHECK(resident->step().status());
    opt.push_back(resident->last_stage().seconds);
  }
  const double optimizer_s = median(opt);
  resident.reset();

  // Copies alone: the same bytes each way through a device of the same kind
  // and budget, from pinned host memory (as the step's are).
  std::unique_ptr<gpu::Device> dev = make_device(device, full.device_bytes);
  const uint64_t piece = std::min<uint64_t>(full.device_bytes / 2, 4ull << 20);
  Result<gpu::DeviceMemory> dbuf = dev->allocate(piece, "copy part");
  STEP_CHECK(dbuf.status());
  std::vector<std::byte> host(piece);
  Result<gpu::HostPin> pin = gpu::HostPin::make(*dev, host.data(), host.size());
  STEP_CHECK(pin.status());
  Result<gpu::Stream> stream = dev->create_stream("copy part");
  STEP_CHECK(stream.status());
  double copies_s = median_seconds(reps, [&] {
    for (uint64_t done = 0; done < h2d; done += piece) {
      STEP_CHECK(dev->copy_to_device(*stream, dbuf->data(), host.data(), std::min(piece, h2d - done)));
    }
    for (uint64_t done = 0; done < d2h; done += piece) {
      STEP_CHECK(dev->copy_to_host(*stream, host.data(), dbuf->data(), std::min(piece, d2h - done)));
    }
    STEP_CHECK(dev->synchronize(*stream));
  });

  // NVMe alone: every state blob (a chunk's, or a piece's of a chunk
  // bigger than the stage's pieces) read and written back, two buffers
  // (nothing when the states are in RAM).
  double nvme_s = 0;
  if (states_nvme) {
    io::SwapStore* swap = offloaded->swap_store();
    const engine::OptimizerStage& stage = offloaded->optimizer_stage();
    int64_t max_elems = 0;
    for (size_t u = 0; u < stage.pieces(); ++u) max_elems = std::max(max_elems, stage.piece_elems(u));
    io::AlignedAllocator allocator;
    Result<std::unique_ptr<engine::PinnedArena>> arena = engine::PinnedArena::create(
        "nvme part", swap->padded_size(engine::OptimizerStage::state_bytes(max_elems, base.adam_states)), 2,
        allocator, nullptr);
    STEP_CHECK(arena.status());
    std::vector<engine::PinnedArena::Lease> leases;
    for (int i = 0; i < 2; ++i) {
      Result<engine::PinnedArena::Lease> l = (*arena)->acquire("nvme part");
      STEP_CHECK(l.status());
      leases.push_back(std::move(*l));
    }
    nvme_s = median_seconds(reps, [&] {
      std::vector<std::optional<io::Ticket>> writes(stage.pieces()), grad_writes(stage.pieces());
      for (size_t u = 0; u < stage.pieces(); ++u) {
        const std::string name = stage.state_blob(u);
        if (u >= 2) {  // the buffer's writes (state, gradient) are done before it is read into again
          STEP_CHECK(swap->wait(*writes[u - 2]));
          if (grad_writes[u - 2]) STEP_CHECK(swap->wait(*grad_writes[u - 2]));
        }
        Result<io::Ticket> r = swap->read(name, leases[u % 2].buffer());
        STEP_CHECK(r.status());
        STEP_CHECK(swap->wait(*r));
        Result<io::Ticket> w = swap->write(name, leases[u % 2].buffer(),
                                           engine::OptimizerStage::state_bytes(stage.piece_elems(u), base.adam_states));
        STEP_CHECK(w.status());
        writes[u] = *w;
        if (grads_nvme) {  // and the piece's 2-byte gradient, as it lands
          Result<io::Ticket> g = swap->write("stepbench-gradient/" + std::to_string(u), leases[u % 2].buffer(),
                                             2 * static_cast<uint64_t>(stage.piece_elems(u)));
          STEP_CHECK(g.status());
          grad_writes[u] = *g;
        }
      }
      STEP_CHECK(swap->wait_all());
    });
  }

  // The planner's model of this placement at the rates just measured.
  const engine::TrainSetup setup = engine::training_setup(full);
  const engine::Placement placement = engine::run_placement(full);
  engine::Bandwidths bw;
  const double flops = gpt::training_flops_per_token(base.model, base.seq, /*recompute=*/true) *
                       static_cast<double>(base.batch * base.seq);
  const double copy_gbps = static_cast<double>(h2d + d2h) / copies_s / 1e9;
  bw.h2d_gbps = bw.d2h_gbps = copy_gbps;
  if (nvme_s > 0) bw.nvme_read_gbps = bw.nvme_write_gbps = static_cast<double>(nvme_r + nvme_w) / nvme_s / 1e9;
  bw.cpu_optimizer_params_per_s = static_cast<double>(params) / optimizer_s;
  // The measured rate over the FLOPs compute_s covers (recompute included,
  // as the streamed step recomputes each block).
  bw.device_tflops = flops / compute_s / 1e12;
  engine::Plan plan = engine::estimate(setup, placement, bw);
  const double predicted = plan.step_seconds;
  const double parts_max = std::max({compute_s, copies_s, optimizer_s, nvme_s});
  const double overlap = parts_max / step_s;
  const double err = (step_s - predicted) / predicted;

  std::printf("\n%-10s %10s %12s\n", "part", "seconds", "bytes/step");
  std::printf("%-10s %10.4f %12s   (forward %.4f, recompute+backward %.4f)\n", "compute", compute_s, "-", fwd_s,
              bwd_s);
  std::printf("%-10s %10.4f %12s\n", "copies", copies_s, format_bytes(h2d + d2h).c_str());
  std::printf("%-10s %10.4f %12s\n", "optimizer", optimizer_s, "-");
  std::printf("%-10s %10.4f %12s\n", "nvme", nvme_s, format_bytes(nvme_r + nvme_w).c_str());
  std::printf("%-10s %10.4f\n", "step", step_s);
  if (delayed_s > 0) {
    std::printf("%-10s %10.4f   (delayed update, not exact: max(parts)/step %.3f)\n", "delayed", delayed_s,
                std::max({compute_s, copies_s, optimizer_s, nvme_s}) / delayed_s);
  }
  std::printf("%-10s %10.4f   (links: ", "predicted", predicted);
  for (const auto& l : plan.links) std::printf("%s %.4f s; ", l.link.c_str(), l.seconds);
  std::printf("not overlapped: head %.4f s, tail %.4f s", plan.head_seconds, plan.tail_seconds);
  std::printf(")\noverlap efficiency max(parts)/step: %.3f, sum(parts)/step: %.3f, prediction error: %+.3f\n",
              overlap, (compute_s + copies_s + optimizer_s + nvme_s) / step_s, err);
  nlohmann::json j = {{"bench", "step"},
                      {"step_s", step_s},
                      {"parts", {{"compute", compute_s}, {"copies", copies_s}, {"optimizer", optimizer_s}, {"nvme", nvme_s}}},
                      {"overlap_efficiency", overlap},
                      {"predicted_s", predicted},
                      {"prediction_error", err},
                      {"parameters", params},
                      {"model_state_bytes", states},
                      {"device_budget_bytes", full.device_bytes},
                      {"device_peak_bytes", device_peak},
                      {"device_idle_fraction", idle},
                      {"compute_threads", compute_threads},
                      {"device", device},
                      {"delayed_update_step_s", delayed_s > 0 ? nlohmann::json(delayed_s) : nlohmann::json(nullptr)},
                      {"h2d_bytes", h2d},
                      {"d2h_bytes", d2h},
                      {"nvme_bytes", nvme_r + nvme_w},
                      {"io_backend", states_nvme ? std::string(offloaded->swap_store()->backend()) : "none"},
                      {"states", states_on},
                      {"sub_group_size", sub_group},
                      {"adam_states", adam_states},
                      {"speculate_in_ram", speculate_in_ram},
                      {"gradients", gradients_on},
                      {"system", system_info()}};
  std::printf("%s\n", j.dump().c_str());
  return 0;
}

}  // namespace
}  // namespace strata::bench

int main(int argc, char** argv) { return strata::bench::run(argc, argv); }
