// Google Benchmark cases for cpu_optim: AdamW in the offload mode (bf16
// gradients in, fp32 master/m/v, bf16 weights out) on every instruction set
// this CPU runs, next to the scalar reference and a same-bytes copy loop
// (the roofline) registered in the same binary with the same arguments.
// Rates: bytes_per_second counts the bytes the mode reads plus writes (28 per
// parameter); items_per_second counts parameters. Compare runs with
// Google Benchmark's compare.py.
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "cpu_optim/executor.h"
#include "cpu_optim/optimizer.h"

namespace strata::bench {
namespace {

using cpu_optim::DType;
using cpu_optim::Isa;

constexpr int64_t kBytesPerParam = 28;

struct Span {
  explicit Span(int64_t n)
      : p(n, 1.0f), m(n, 0.0f), v(n, 0.0f), g(n, cpu_optim::f32_to_bf16(0.01f)), out(n, 0) {}
  std::vector<float> p, m, v;
  std::vector<uint16_t> g, out;

  cpu_optim::ParamSpan view() {
    cpu_optim::ParamSpan s;
    s.params = p.data();
    s.n = static_cast<int64_t>(p.size());
    s.grad = g.data();
    s.grad_dtype = DType::kBF16;
    s.weights_out = out.data();
    s.out_dtype = DType::kBF16;
    s.state.m = m.data();
    s.state.v = v.data();
    return s;
  }
};

void set_rates(benchmark::State& state, int64_t n) {
  state.SetItemsProcessed(state.iterations() * n);
  state.SetBytesProcessed(state.iterations() * n * kBytesPerParam);
}

void BM_AdamWOffload(benchmark::State& state, Isa isa) {
  const int64_t n = state.range(0);
  auto ex = cpu_optim::Executor::create({static_cast<int>(state.range(1)), -1});
  if (!ex) {
    state.SkipWithError(ex.error().to_string().c_str());
    return;
  }
  bool available = false;
  for (Isa i : cpu_optim::available_isas()) available |= i == isa;
  if (!available) {
    state.SkipWithError("instruction set not available on this CPU");
    return;
  }
  Span span(n);
  cpu_optim::AdamConfig adamw;
  cpu_optim::StepOptions options;
  options.isa = isa;
  options.nonfinite = cpu_optim::NonFinitePolicy::kReportOnly;
  int64_t t = 0;
  for (auto _ : state) {
    auto r = cpu_optim::step(adamw, ++t, span.view(), options, **ex);
    benchmark::DoNotOptimize(r);
  }
  set_rates(state, n);
}

// The baseline: the same streams and bytes, no arithmetic.
void BM_RooflineOffload(benchmark::State& state) {
  const int64_t n = state.range(0);
  auto ex = cpu_optim::Executor::create({static_cast<int>(state.range(1)), -1});
  Span span(n);
  for (auto _ : state) {
    (*ex)->parallel_for(n, 1 << 16, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        float mi = span.m[i];
        span.p[i] = span.p[i] + 0.0f;
        span.m[i] = span.v[i];
        span.v[i] = mi;
        span.out[i] = span.g[i];
      }
    });
    benchmark::ClobberMemory();
  }
  set_rates(state, n);
}

void args(benchmark::internal::Benchmark* b) {
  for (int64_t n : {int64_t{1} << 16, int64_t{1} << 24}) {
    for (int64_t threads : {1, 2}) b->Args({n, threads});
  }
  b->ArgNames({"params", "threads"})->UseRealTime()->Unit(benchmark::kMillisecond);
}

BENCHMARK_CAPTURE(BM_AdamWOffload, avx512_bf16, Isa::kAvx512Bf16)->Apply(args);
BENCHMARK_CAPTURE(BM_AdamWOffload, avx512, Isa::kAvx512)->Apply(args);
BENCHMARK_CAPTURE(BM_AdamWOffload, avx2, Isa::kAvx2)->Apply(args);
BENCHMARK_CAPTURE(BM_AdamWOffload, sse2, Isa::kSse2)->Apply(args);
BENCHMARK_CAPTURE(BM_AdamWOffload, scalar_reference, Isa::kScalar)->Apply(args);
BENCHMARK(BM_RooflineOffload)->Apply(args);

}  // namespace
}  // namespace strata::bench

BENCHMARK_MAIN();
