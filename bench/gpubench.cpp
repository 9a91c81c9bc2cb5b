// strata-gpubench: the CUDA backend's ops and one block (forward+backward)
// in TFLOP/s or GB/s, next to a cuBLASLt GEMM of the block's largest shape
// measured in the same run, and pinned host<->device copy bandwidth. GPU
// timings use CUDA events, median of --reps after a warm-up, with the L2
// flushed (a 256 MiB memset) before each repetition. Ends with one JSON line.
#include <cuda_runtime.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "common/dtype.h"
#include "gpu/cuda/cuda_device.h"
#include "gpu/cuda/ops.h"
#include "models/gpt/cuda/block.h"

namespace strata::bench {
namespace {

using gpu::DeviceMemory;

#define BENCH_CHECK(expr) exit_on_error((expr), "strata-gpubench")

struct Timer {
  cudaStream_t stream;
  void* flush;
  size_t flush_bytes;
  int reps;
  // Median milliseconds of fn over reps, each after an L2 flush.
  double ms(const std::function<void()>& fn) const {
    cudaEvent_t a, b;
    cudaEventCreate(&a);
    cudaEventCreate(&b);
    fn();
    std::vector<float> t;
    for (int r = 0; r < reps; ++r) {
      cudaMemsetAsync(flush, r, flush_bytes, stream);
      cudaEventRecord(a, stream);
      fn();
      cudaEventRecord(b, stream);
      cudaEventSynchronize(b);
      float v = 0;
      cudaEventElapsedTime(&v, a, b);
      t.push_back(v);
    }
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
  }
};

int run(int argc, char** argv) {
  CLI::App app{"strata-gpubench: CUDA ops and a transformer block vs a cuBLASLt GEMM; pinned copy bandwidth"};
  gpt::GptConfig c;
  c.hidden = 1600, c.heads = 25, c.layers = 1;
  int64_t batch = 4, seq = 512;
  int reps = 5;
  app.add_option("--hidden", c.hidden, "hidden size C")->capture_default_str();
  app.add_option("--heads", c.heads, "attention heads")->capture_default_str();
  app.add_option("--batch", batch, "micro-batch B")->capture_default_str();
  app.add_option("--seq", seq, "sequence length T")->capture_default_str();
  app.add_option("--reps", reps, "timed repetitions (median kept)")->capture_default_str()->check(CLI::Range(1, 100));
  CLI11_PARSE(app, argc, argv);
  c.max_seq = seq;
  c.vocab = 50257;
  BENCH_CHECK(c.validate());
  const int64_t N = batch * seq, C = c.hidden;

  Result<std::unique_ptr<gpu::cuda::CudaDevice>> dev_r = gpu::cuda::CudaDevice::create({});
  BENCH_CHECK(dev_r.status());
  gpu::cuda::CudaDevice& dev = **dev_r;
  gpu::Stream sh = *dev.create_stream("bench");
  cudaStream_t s = *dev.native(sh);
  Result<gpu::cuda::BlasContext> blas_r = gpu::cuda::BlasContext::create(dev.device_index());
  BENCH_CHECK(blas_r.status());
  const gpu::cuda::BlasContext& blas = *blas_r;
  auto alloc = [&](uint64_t bytes, const char* what) {
    Result<DeviceMemory> m = dev.allocate(bytes, what);
    BENCH_CHECK(m.status());
    return std::move(m).value();
  };
  DeviceMemory flush = alloc(256ull << 20, "L2 flush buffer");
  Timer timer{s, flush.data(), flush.bytes(), reps};

  gpt::ChunkLayout layout = gpt::block_layout(c, 0);
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0.0f, 0.02f);
  std::vector<float> host_params(static_cast<size_t>(layout.numel)), host_x(static_cast<size_t>(N * C));
  for (float& p : host_params) p = nd(rng);
  for (float& v : host_x) v = nd(rng) * 50;
  DeviceMemory params = alloc(host_params.size() * 4, "block parameters");
  DeviceMemory grads = alloc(host_params.size() * 4, "block gradients");
  DeviceMemory x = alloc(N * C * 4, "block input"), y = alloc(N * C * 4, "block output");
  DeviceMemory dy = alloc(N * C * 4, "block output gradient"), dx = alloc(N * C * 4, "block input gradient");
  BENCH_CHECK(dev.copy_to_device(sh, params.data(), host_params.data(), params.bytes()));
  BENCH_CHECK(dev.copy_to_device(sh, x.data(), host_x.data(), N * C * 4));
  BENCH_CHECK(dev.copy_to_device(sh, dy.data(), host_x.data(), N * C * 4));
  BENCH_CHECK(dev.synchronize(sh));
  Result<gpt::cuda::BlockBuffers> buf_r = gpt::cuda::allocate_block_buffers(dev, c, batch, seq);
  BENCH_CHECK(buf_r.status());
  gpt::cuda::BlockBuffers& buf = *buf_r;

  struct Row {
    std::string what;
    double ms;
    double tflops;
    double gbps;
  };
  std::vector<Row> rows;
  const gpt::BlockOffsets o = gpt::block_offsets(c);
  const float* p = params.as<float>();
  auto tflops = [](double flops, double ms) { return flops / (ms * 1e-3) / 1e12; };

  // Baseline: the block's largest GEMM, [N,C] x [C,4C], through cuBLASLt.
  double gemm_ms = timer.ms([&] {
    BENCH_CHECK(gpu::cuda::matmul_forward(blas, s, buf.fch.as<float>(), buf.ln2.as<float>(), p + o.fcw,
                                          static_cast<const float*>(nullptr), N, C,
                                          4 * C));
  });
  double gemm_tf = tflops(2.0 * N * C * 4 * C, gemm_ms);
  rows.push_back({"cuBLASLt GEMM [N,C]x[C,4C]", gemm_ms, gemm_tf, 0});
  double qkv_ms = timer.ms([&] {
    BENCH_CHECK(gpu::cuda::matmul_forward(blas, s, buf.qkv.as<float>(), buf.ln1.as<float>(), p + o.attnw,
                                          p + o.attnb, N, C, 3 * C));
  });
  rows.push_back({"matmul qkv (+bias)", qkv_ms, tflops(2.0 * N * C * 3 * C, qkv_ms), 0});
  const double att_flops = 2.0 * batch * seq * seq * C;  // causal: half of QK^T and PV
  DeviceMemory probs = alloc(static_cast<uint64_t>(batch * c.heads * seq * seq) * 4, "unfused attention probabilities");
  double att_ms = timer.ms([&] {
    BENCH_CHECK(gpu::cuda::attention_forward(s, buf.atty.as<float>(), probs.as<float>(), buf.qkv.as<float>(), batch,
                                             seq, C, c.heads));
  });
  rows.push_back({"attention forward (unfused)", att_ms, tflops(att_flops, att_ms), 0});
  double flash_ms = timer.ms([&] {
    BENCH_CHECK(gpu::cuda::flash_attention_forward(s, buf.atty.as<float>(), buf.lse.as<float>(), buf.qkv.as<float>(),
                                                   batch, seq, C, c.heads));
  });
  rows.push_back({"attention forward (fused)", flash_ms, tflops(att_flops, flash_ms), 0});
  double flash_bwd_ms = timer.ms([&] {
    BENCH_CHECK(gpu::cuda::flash_attention_backward(s, buf.dqkv.as<float>(), buf.drow.as<float>(),
                                                    buf.datty.as<float>(), buf.atty.as<float>(), buf.qkv.as<float>(),
                                                    buf.lse.as<float>(), batch, seq, C, c.heads));
  });
  // backward recomputes QK^T and computes dP, dV, dQ, dK: 2.5x the forward's products
  rows.push_back({"attention backward (fused)", flash_bwd_ms, tflops(2.5 * att_flops, flash_bwd_ms), 0});
  double ln_ms = timer.ms([&] {
    BENCH_CHECK(gpu::cuda::layernorm_forward(s, buf.ln1.as<float>(), buf.ln1_mean.as<float>(),
                                             buf.ln1_rstd.as<float>(), x.as<float>(), p + o.ln1w, p + o.ln1b, N, C));
  });
  rows.push_back({"layernorm forward", ln_ms, 0, 2.0 * N * C * 4 / (ln_ms * 1e-3) / 1e9});
  double gelu_ms = timer.ms([&] {
    BENCH_CHECK(gpu::cuda::gelu_forward(s, buf.fch_gelu.as<float>(), buf.fch.as<float>(), N * 4 * C));
  });
  rows.push_back({"gelu forward", gelu_ms, 0, 2.0 * N * 4 * C * 4 / (gelu_ms * 1e-3) / 1e9});
  double block_ms = timer.ms([&] {
    BENCH_CHECK(gpt::cuda::block_forward(blas, s, c, p, x.as<float>(), y.as<float>(), buf, batch, seq));
    BENCH_CHECK(gpt::cuda::block_backward(blas, s, c, p, grads.as<float>(), x.as<float>(), buf, dy.as<float>(),
                                          dx.as<float>(), batch, seq));
  });
  double block_flops = 3.0 * (24.0 * C * C + 2.0 * seq * C) * N;  // causal attention: half the products
  double block_tf = tflops(block_flops, block_ms);
  rows.push_back({"block forward+backward", block_ms, block_tf, 0});

  // bf16: the same block and GEMM baseline on bf16 copies of the same tensors.
  double bf16_gemm_tf = 0, bf16_block_tf = 0;
  {
    using bf16 = __nv_bfloat16;
    std::vector<uint16_t> hp(host_params.size()), hx(host_x.size());
    for (size_t i = 0; i < hp.size(); ++i) hp[i] = f32_to_bf16(host_params[i]);
    for (size_t i = 0; i < hx.size(); ++i) hx[i] = f32_to_bf16(host_x[i]);
    DeviceMemory bp = alloc(hp.size() * 2, "bf16 block parameters"), bg = alloc(hp.size() * 2, "bf16 block gradients");
    DeviceMemory bx = alloc(N * C * 2, "bf16 block input"), by = alloc(N * C * 2, "bf16 block output");
    DeviceMemory bdy = alloc(N * C * 2, "bf16 output gradient"), bdx = alloc(N * C * 2, "bf16 input gradient");
    BENCH_CHECK(dev.copy_to_device(sh, bp.data(), hp.data(), bp.bytes()));
    BENCH_CHECK(dev.copy_to_device(sh, bx.data(), hx.data(), bx.bytes()));
    BENCH_CHECK(dev.copy_to_device(sh, bdy.data(), hx.data(), bdy.bytes()));
    BENCH_CHECK(dev.synchronize(sh));
    Result<gpt::cuda::BlockBuffers> bb_r = gpt::cuda::allocate_block_buffers(dev, c, batch, seq, 2);
    BENCH_CHECK(bb_r.status());
    gpt::cuda::BlockBuffers& bb = *bb_r;
    const bf16* q = bp.as<bf16>();
    double g_ms = timer.ms([&] {
      BENCH_CHECK(gpu::cuda::matmul_forward(blas, s, bb.fch.as<bf16>(), bb.ln2.as<bf16>(), q + o.fcw,
                                            static_cast<const bf16*>(nullptr), N, C, 4 * C));
    });
    bf16_gemm_tf = tflops(2.0 * N * C * 4 * C, g_ms);
    rows.push_back({"bf16 cuBLASLt GEMM [N,C]x[C,4C]", g_ms, bf16_gemm_tf, 0});
    double b_ms = timer.ms([&] {
      BENCH_CHECK(gpt::cuda::block_forward(blas, s, c, q, bx.as<bf16>(), by.as<bf16>(), bb, batch, seq));
      BENCH_CHECK(gpt::cuda::block_backward(blas, s, c, q, bg.as<bf16>(), bx.as<bf16>(), bb, bdy.as<bf16>(),
                                            bdx.as<bf16>(), batch, seq));
    });
    bf16_block_tf = tflops(block_flops, b_ms);
    rows.push_back({"bf16 block forward+backward", b_ms, bf16_block_tf, 0});
  }

  // Pinned host <-> device copies.
  const size_t copy_bytes = 256ull << 20;
  void* pinned = nullptr;
  if (cudaHostAlloc(&pinned, copy_bytes, cudaHostAllocDefault) != cudaSuccess) {
    std::fprintf(stderr, "strata-gpubench: cudaHostAlloc of %zu bytes failed\n", copy_bytes);
    return 1;
  }
  DeviceMemory dbuf = alloc(copy_bytes, "copy target");
  double h2d_ms = timer.ms([&] { cudaMemcpyAsync(dbuf.data(), pinned, copy_bytes, cudaMemcpyHostToDevice, s); });
  double d2h_ms = timer.ms([&] { cudaMemcpyAsync(pinned, dbuf.data(), copy_bytes, cudaMemcpyDeviceToHost, s); });
  cudaFreeHost(pinned);
  rows.push_back({"pinned H2D 256 MiB", h2d_ms, 0, copy_bytes / (h2d_ms * 1e-3) / 1e9});
  rows.push_back({"pinned D2H 256 MiB", d2h_ms, 0, copy_bytes / (d2h_ms * 1e-3) / 1e9});
  BENCH_CHECK(dev.async_error());

  std::printf("strata-gpubench: %s, fp32 (and bf16 where named), C=%lld NH=%lld B=%lld T=%lld, median of %d (L2 flushed)\n",
              std::string(dev.name()).c_str(), static_cast<long long>(C), static_cast<long long>(c.heads),
              static_cast<long long>(batch), static_cast<long long>(seq), reps);
  std::printf("%-32s %10s %9s %9s %12s\n", "what", "ms", "TFLOP/s", "GB/s", "vs GEMM");
  nlohmann::json jrows = nlohmann::json::array();
  for (const Row& r : rows) {
    // bf16 rows compare with the bf16 GEMM, the others with the fp32 one
    const double base = r.what.rfind("bf16", 0) == 0 ? bf16_gemm_tf : gemm_tf;
    std::printf("%-32s %10.3f %9.2f %9.1f %12s\n", r.what.c_str(), r.ms, r.tflops, r.gbps,
                r.tflops > 0 ? std::to_string(r.tflops / base).substr(0, 5).c_str() : "-");
    jrows.push_back({{"what", r.what}, {"ms", r.ms}, {"tflops", r.tflops}, {"gbps", r.gbps}});
  }
  nlohmann::json j = {{"bench", "gpu"}, {"device", std::string(dev.name())}, {"hidden", C}, {"heads", c.heads},
                      {"batch", batch}, {"seq", seq}, {"block_tflops", block_tf}, {"gemm_tflops", gemm_tf},
                      {"block_ratio_to_gemm", block_tf / gemm_tf},
                      {"bf16_block_tflops", bf16_block_tf}, {"bf16_gemm_tflops", bf16_gemm_tf},
                      {"bf16_block_ratio_to_gemm", bf16_block_tf / bf16_gemm_tf}, {"rows", jrows}, {"system", system_info()}};
  std::printf("%s\n", j.dump().c_str());
  return 0;
}

}  // namespace
}  // namespace strata::bench

int main(int argc, char** argv) { return strata::bench::run(argc, argv); }
