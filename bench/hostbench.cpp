// strata-hostbench: one transformer block's forward + backward on the host
// backend (fp32), in GFLOP/s, next to OpenBLAS sgemm of the block's largest
// GEMM shape measured in the same run. Ends with one JSON line.
#include <cblas.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>
#include <vector>

#include "bench/bench_util.h"
#include "models/gpt/gpt_config.h"
#include "models/gpt/host/gpt.h"

namespace strata::bench {
namespace {


int run(int argc, char** argv) {
  CLI::App app{"strata-hostbench: host-backend transformer block forward+backward GFLOP/s vs OpenBLAS sgemm"};
  gpt::GptConfig c;
  int64_t batch = 4, seq = 256;
  int reps = 3;
  app.add_option("--hidden", c.hidden, "hidden size C")->capture_default_str();
  app.add_option("--heads", c.heads, "attention heads")->capture_default_str();
  app.add_option("--batch", batch, "micro-batch B")->capture_default_str()->check(CLI::Range(1, 1024));
  app.add_option("--seq", seq, "sequence length T")->capture_default_str()->check(CLI::Range(1, 65536));
  app.add_option("--reps", reps, "timed repetitions (median kept)")->capture_default_str()->check(CLI::Range(1, 100));
  CLI11_PARSE(app, argc, argv);
  c.layers = 1;
  c.max_seq = seq;
  if (Status s = c.validate(); !s.ok()) {
    std::fprintf(stderr, "strata-hostbench: %s\n", s.to_string().c_str());
    return 2;
  }
  const int64_t N = batch * seq, C = c.hidden;
  gpt::ChunkLayout layout = gpt::block_layout(c, 0);
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0.0f, 0.02f);
  std::vector<float> params(static_cast<size_t>(layout.numel)), grads(params.size(), 0.0f);
  for (float& p : params) p = nd(rng);
  std::vector<float> x(static_cast<size_t>(N * C)), y(x.size()), dy(x.size()), dx(x.size());
  for (float& v : x) v = nd(rng) * 50;
  for (float& v : dy) v = nd(rng);
  gpt::host::BlockActivations<float> acts;
  acts.resize(c, batch, seq);
  double block_s = median_seconds(reps, [&] {
    gpt::host::block_forward(c, params.data(), x.data(), y.data(), acts, batch, seq);
    std::fill(dx.begin(), dx.end(), 0.0f);
    gpt::host::block_backward(c, params.data(), grads.data(), x.data(), acts, dy.data(), dx.data(), batch, seq);
  });
  // Model FLOPs of one block per token, forward + backward (3x forward).
  const double flops = 3.0 * (24.0 * C * C + 4.0 * static_cast<double>(seq) * C) * static_cast<double>(N);
  // Baseline: the block's largest GEMM, [N, C] x [C, 4C], alone.
  std::vector<float> a(static_cast<size_t>(N * C), 0.5f), b(static_cast<size_t>(C * 4 * C), 0.25f),
      out(static_cast<size_t>(N * 4 * C));
  double gemm_s = median_seconds(reps, [&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(N), static_cast<int>(4 * C),
                static_cast<int>(C), 1.0f, a.data(), static_cast<int>(C), b.data(), static_cast<int>(4 * C), 0.0f,
                out.data(), static_cast<int>(4 * C));
  });
  const double gemm_gflops = 2.0 * N * C * 4.0 * C / gemm_s / 1e9;
  const double block_gflops = flops / block_s / 1e9;
  std::printf("strata-hostbench: block C=%lld NH=%lld B=%lld T=%lld (fp32, forward+backward)\n",
              static_cast<long long>(C), static_cast<long long>(c.heads), static_cast<long long>(batch),
              static_cast<long long>(seq));
  std::printf("%-28s %10s %10s\n", "what", "seconds", "GFLOP/s");
  std::printf("%-28s %10.4f %10.2f\n", "block forward+backward", block_s, block_gflops);
  std::printf("%-28s %10.4f %10.2f\n", "sgemm [N,C]x[C,4C]", gemm_s, gemm_gflops);
  std::printf("ratio block/sgemm: %.3f\n", block_gflops / gemm_gflops);
  nlohmann::json j = {{"bench", "host_block"}, {"hidden", C}, {"heads", c.heads}, {"batch", batch}, {"seq", seq},
                      {"block_seconds", block_s}, {"block_gflops", block_gflops}, {"sgemm_gflops", gemm_gflops},
                      {"ratio_to_sgemm", block_gflops / gemm_gflops}, {"system", system_info()}};
  std::printf("%s\n", j.dump().c_str());
  return 0;
}

}  // namespace
}  // namespace strata::bench

int main(int argc, char** argv) { return strata::bench::run(argc, argv); }
