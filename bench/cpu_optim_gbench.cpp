// Google Benchmark cases for cpu_optim: AdamW in each of strata-adambench's
// modes — offload (bf16 gradients in, fp32 master/m/v, bf16 weights out),
// fp32 (fp32 gradients and states, no copy out), bf16_state and q8_state
// (offload with bf16 / 8-bit blockwise m and v) — on every instruction set
// this CPU runs, next to the scalar reference and a same-bytes copy loop per
// mode (the roofline: strata-adambench's 64-byte-line twin) registered in
// the same binary with the same arguments.
// Rates: bytes_per_second counts the bytes the mode reads plus writes (28,
// 28, 20 and about 16 per parameter); items_per_second counts parameters.
// Compare runs with Google Benchmark's compare.py.
#include <benchmark/benchmark.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "bench/adam_modes.h"
#include "bench/roofline_lines.h"
#include "common/aligned_vector.h"
#include "common/units.h"
#include "cpu_optim/executor.h"
#include "cpu_optim/optimizer.h"

namespace strata::bench {
namespace {

using cpu_optim::DType;
using cpu_optim::Isa;
using cpu_optim::StateType;

using Mode = AdamMode;

// One span's buffers in the mode's types (the states zero, which every
// state type decodes as 0).
struct Span {
  Span(const Mode& of, int64_t elems)
      : mode(of),
        n(elems),
        p(bytes(4)),
        g(bytes(cpu_optim::dtype_bytes(mode.grad))),
        m(bytes(cpu_optim::state_elem_bytes(mode.state))),
        v(bytes(cpu_optim::state_elem_bytes(mode.state))),
        scales(2 * static_cast<size_t>(div_ceil(static_cast<uint64_t>(n), cpu_optim::kQ8BlockElems)), 0.0f),
        out(bytes(2)) {
    for (int64_t i = 0; i < n; ++i) {
      reinterpret_cast<float*>(p.data())[i] = 1.0f;
      if (mode.grad == DType::kF32) {
        reinterpret_cast<float*>(g.data())[i] = 0.01f;
      } else {
        reinterpret_cast<uint16_t*>(g.data())[i] = cpu_optim::f32_to_bf16(0.01f);
      }
    }
  }
  // Zeroed storage for n elements of `elem` bytes (64-byte aligned, as the
  // line twin needs).
  AlignedVector<std::byte> bytes(uint64_t elem) const {
    return AlignedVector<std::byte>(static_cast<size_t>(n) * elem, std::byte{0});
  }
  Mode mode;
  int64_t n;
  AlignedVector<std::byte> p, g, m, v;
  AlignedVector<float> scales;  // m's, then v's
  AlignedVector<std::byte> out;

  cpu_optim::ParamSpan view() {
    cpu_optim::ParamSpan s;
    s.params = reinterpret_cast<float*>(p.data());
    s.n = n;
    s.grad = g.data();
    s.grad_dtype = mode.grad;
    s.weights_out = mode.out ? out.data() : nullptr;
    s.out_dtype = DType::kBF16;
    s.state.type = mode.state;
    s.state.m = m.data();
    s.state.v = v.data();
    s.state.m_scale = scales.data();
    s.state.v_scale = scales.data() + scales.size() / 2;
    return s;
  }
};

void set_rates(benchmark::State& state, const Mode& mode, int64_t n) {
  state.SetItemsProcessed(state.iterations() * n);
  state.SetBytesProcessed(
      static_cast<int64_t>(static_cast<double>(state.iterations() * n) * adam_bytes_per_param(mode)));
}

std::unique_ptr<cpu_optim::Executor> executor(benchmark::State& state) {
  auto ex = cpu_optim::Executor::create({static_cast<int>(state.range(1)), -1});
  if (!ex) {
    state.SkipWithError(ex.error().to_string().c_str());
    return nullptr;
  }
  return std::move(*ex);
}

void BM_AdamW(benchmark::State& state, Mode mode, Isa isa) {
  const int64_t n = state.range(0);
  std::unique_ptr<cpu_optim::Executor> ex = executor(state);
  if (!ex) return;
  Span span(mode, n);
  cpu_optim::AdamConfig adamw;
  adamw.weight_decay = 0.01f;
  cpu_optim::StepOptions options;
  options.isa = isa;
  options.nonfinite = cpu_optim::NonFinitePolicy::kReportOnly;
  int64_t t = 0;
  for (auto _ : state) {
    auto r = cpu_optim::step(adamw, ++t, span.view(), options, *ex);
    if (!r) {
      state.SkipWithError(r.error().to_string().c_str());
      return;
    }
    benchmark::DoNotOptimize(r);
  }
  set_rates(state, mode, n);
}

// The baseline: the mode's streams and bytes, no arithmetic —
// strata-adambench's line twin (bench/roofline_lines.h): p, m and v read and
// written back unchanged, g read into the weights copy (non-temporal, as the
// kernels write it) or, with none, into a checksum, one full-width vector
// instruction per 64-byte line.
volatile uint64_t opaque_zero = 0;  // the twin's key: p, m, v keep their bits

void BM_Roofline(benchmark::State& state, Mode mode) {
  const int64_t n = state.range(0);
  std::unique_ptr<cpu_optim::Executor> ex = executor(state);
  if (!ex) return;
  const int g = static_cast<int>(cpu_optim::dtype_bytes(mode.grad));
  const int sb = static_cast<int>(cpu_optim::state_elem_bytes(mode.state));
  const TwinFn twin = roofline_lines(g, sb, mode.out);
  if (twin == nullptr || n % 64 != 0) {
    state.SkipWithError("the line twin needs AVX2 or AVX-512 and a multiple of 64 parameters");
    return;
  }
  Span span(mode, n);
  const uint64_t key = opaque_zero;
  for (auto _ : state) {
    std::atomic<uint64_t> sink{0};
    ex->parallel_for(n / 64, 1 << 10, [&](int64_t begin, int64_t end) {
      const int64_t first = begin * 64;
      sink ^= twin(span.p.data() + first * 4, span.g.data() + first * g, span.m.data() + first * sb,
                   span.v.data() + first * sb, span.out.data() + first * 2, end - begin, key);
    });
    benchmark::DoNotOptimize(sink.load());
  }
  set_rates(state, mode, n);
}

void args(benchmark::internal::Benchmark* b) {
  for (int64_t n : {int64_t{1} << 16, int64_t{1} << 24}) {
    for (int64_t threads : {1, 2}) b->Args({n, threads});
  }
  b->ArgNames({"params", "threads"})->UseRealTime()->Unit(benchmark::kMillisecond);
}

// Every mode's cases: AdamW on each instruction set this CPU runs and the
// scalar reference, then the roofline.
void register_cases() {
  const std::vector<Isa> isas = cpu_optim::available_isas();  // the scalar reference last
  for (const Mode& mode : kAdamModes) {
    const std::string mode_name(mode.name);
    for (Isa isa : isas) {
      const std::string name = "BM_AdamW/" + mode_name + "/" + std::string(cpu_optim::isa_name(isa));
      benchmark::RegisterBenchmark(name.c_str(), BM_AdamW, mode, isa)->Apply(args);
    }
    benchmark::RegisterBenchmark((std::string("BM_Roofline/") + mode_name).c_str(), BM_Roofline, mode)->Apply(args);
  }
}

}  // namespace
}  // namespace strata::bench

int main(int argc, char** argv) {
  strata::bench::register_cases();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
