#include "engine/calibrate.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <vector>

#include "cpu_optim/executor.h"
#include "cpu_optim/optimizer.h"
#include "gpu/calibrate.h"
#include "io/swap_store.h"

namespace strata::engine {
namespace {

// AdamW's parameters per second over fp32 master weights and states with
// a bf16 gradient and bf16 weights written out: the optimizer stage's work.
// Over the model's parameters up to 64 Mi (1.25 GiB of states and
// gradients): a small model's states stay in the caches, as they do in its
// training; a large one's stream from memory.
Result<double> measure_optimizer(int64_t params, int threads, double min_seconds) {
  cpu_optim::ExecutorOptions eo;
  eo.threads = threads;
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<cpu_optim::Executor> ex, cpu_optim::Executor::create(eo));
  const int64_t kN = std::clamp<int64_t>(params, int64_t{1} << 20, int64_t{1} << 26);
  std::vector<float> p(kN, 0.01f), m(kN, 0.0f), v(kN, 0.0f);
  std::vector<uint16_t> g(kN, 0x3c00), w(kN);  // bf16 gradients of 0.0078
  cpu_optim::ParamSpan span;
  span.params = p.data();
  span.n = kN;
  span.grad = g.data();
  span.grad_dtype = DType::kBF16;
  span.weights_out = w.data();
  span.out_dtype = DType::kBF16;
  span.state.m = m.data();
  span.state.v = v.data();
  cpu_optim::AdamConfig adam;
  adam.weight_decay = 0.01;
  cpu_optim::StepOptions so;
  so.nonfinite = cpu_optim::NonFinitePolicy::kReportOnly;
  int64_t t = 1;
  STRATA_RETURN_IF_ERROR(cpu_optim::step(adam, t++, span, so, *ex).status());  // warm-up: first touches
  const auto t0 = std::chrono::steady_clock::now();
  double elapsed = 0;
  do {
    STRATA_RETURN_IF_ERROR(cpu_optim::step(adam, t++, span, so, *ex).status());
    elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  } while (elapsed < min_seconds);
  return static_cast<double>(kN) * static_cast<double>(t - 2) / elapsed;
}

// Write then read rates (bytes per second) of the swap store over `paths`:
// kBlobs blobs of kBlob bytes in flight at once, as the optimizer stage's
// pieces are. The swap file is unlinked scratch, gone when the store closes.
Result<std::pair<double, double>> measure_nvme(const std::vector<std::string>& paths) {
  constexpr int kBlobs = 8;
  constexpr uint64_t kBlob = uint64_t{8} << 20;
  io::SwapStoreOptions so;
  so.directories = paths;
  so.direct = io::DirectMode::kPrefer;
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<io::SwapStore> store, io::SwapStore::open(so));
  io::AlignedAllocator alloc;
  std::vector<io::Buffer> buffers;
  for (int i = 0; i < kBlobs; ++i) {
    STRATA_ASSIGN_OR_RETURN(io::Buffer b, alloc.allocate(store->padded_size(kBlob), store->alignment()));
    std::fill(b.data(), b.data() + kBlob, std::byte{static_cast<unsigned char>(i + 1)});
    buffers.push_back(std::move(b));
  }
  auto pass = [&](bool write) -> Result<double> {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < kBlobs; ++i) {
      const std::string name = "calibration-" + std::to_string(i);
      Result<io::Ticket> t = write ? store->write(name, buffers[static_cast<size_t>(i)].view(), kBlob)
                                   : store->read(name, buffers[static_cast<size_t>(i)].view());
      STRATA_RETURN_IF_ERROR(t.status());
    }
    STRATA_RETURN_IF_ERROR(store->wait_all());
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return static_cast<double>(kBlob) * kBlobs / s;
  };
  STRATA_ASSIGN_OR_RETURN(double write, pass(true));
  STRATA_ASSIGN_OR_RETURN(double read, pass(false));
  return std::pair{write, read};
}

}  // namespace

Result<Bandwidths> measure_bandwidths(gpu::Device& device, const TrainSetup& setup, const CalibrateOptions& options) {
  Bandwidths bw;
  if (setup.model == nullptr) return invalid_argument("calibrate: no model to measure");
  STRATA_ASSIGN_OR_RETURN(double flops,
                          setup.model->measure_flops(device, setup.compute, setup.micro_batch, options.seconds_each));
  bw.device_tflops = flops / 1e12;
  const uint64_t copy_bytes = std::min<uint64_t>(uint64_t{16} << 20, std::max<uint64_t>(device.capacity_bytes() / 4, 1 << 20));
  STRATA_ASSIGN_OR_RETURN(double copy, gpu::measure_copy_rate(device, copy_bytes, options.seconds_each / 3));
  bw.h2d_gbps = copy / 1e9;
  bw.d2h_gbps = copy / 1e9;
  STRATA_ASSIGN_OR_RETURN(
      bw.cpu_optimizer_params_per_s,
      measure_optimizer(setup.model->parameters(), options.optimizer_threads, options.seconds_each));
  bw.shares_host_cores = options.host_backend;
  const char* nvme_source = "defaults";
  if (!options.nvme_paths.empty()) {
    STRATA_ASSIGN_OR_RETURN(auto nvme, measure_nvme(options.nvme_paths));
    bw.nvme_write_gbps = nvme.first / 1e9;
    bw.nvme_read_gbps = nvme.second / 1e9;
    nvme_source = "measured";
  }
  char text[320];
  std::snprintf(text, sizeof text,
                "measured on %s: compute %.1f GFLOP/s (the model's own ops), copies %.1f GB/s, CPU optimizer "
                "%.0f M params/s; NVMe %.2f/%.2f GB/s read/write (%s)",
                std::string(device.name()).c_str(), flops / 1e9, copy / 1e9, bw.cpu_optimizer_params_per_s / 1e6,
                bw.nvme_read_gbps, bw.nvme_write_gbps, nvme_source);
  bw.source = text;
  return bw;
}

}  // namespace strata::engine
