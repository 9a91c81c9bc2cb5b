// strata-adambench: AdamW throughput of cpu_optim on a large flat span, next
// to baselines measured in the same run and at the same thread count:
//   roofline — a loop that reads and writes exactly the streams of the mode
//              (same element sizes, same bytes) and does no arithmetic (the
//              fastest of four such twins), timed in turn with the step
//              itself, a run of each per round, so both see the same
//              stretch of a shared machine's time;
//   naive    — the scalar reference kernel (plain loops, no SIMD);
//   triad    — STREAM's a = b + s * c, for the machine's bandwidth.
// Modes: offload (bf16 grads in; fp32 master, m, v; bf16 weights out),
// fp32 (fp32 grads; fp32 states; no low-precision copy), bf16_state and
// q8_state (as offload, with bf16 / 8-bit blockwise m and v).
// Bytes counted per parameter are the bytes the mode reads plus writes.
// Buffers sit on 2 MiB (transparent huge) pages, as strata's own do;
// --pages 4k puts them on 4 KiB pages.
// Prints a table and ends with one JSON line holding every figure.
#include <immintrin.h>
#include <pthread.h>
#include <sched.h>
#include <sys/mman.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "bench/adam_modes.h"
#include "bench/bench_util.h"
#include "bench/roofline_lines.h"
#include "common/check.h"
#include "common/huge_pages.h"
#include "common/units.h"
#include "cpu_optim/executor.h"
#include "cpu_optim/optimizer.h"

namespace strata::bench {
namespace {

using cpu_optim::DType;
using cpu_optim::Executor;
using cpu_optim::Isa;
using cpu_optim::StateType;
using cpu_optim::state_elem_bytes;

using Mode = AdamMode;

// Bytes of the ranges [begin, end) that the kernel backs with huge pages,
// from /proc/self/smaps. The buffers are advised (MADV_HUGEPAGE or
// MADV_NOHUGEPAGE) over exactly their 2 MiB-aligned extent, which splits
// each into a mapping of its own, so a mapping inside a range counts
// whole; one that only overlaps counts its share.
uint64_t huge_bytes_in(const std::vector<std::pair<uintptr_t, uintptr_t>>& ranges) {
  std::FILE* f = std::fopen("/proc/self/smaps", "r");
  if (f == nullptr) return 0;
  char line[512];
  double overlap_share = 0;  // of the current mapping, inside the ranges
  double bytes = 0;
  while (std::fgets(line, sizeof line, f) != nullptr) {
    unsigned long lo = 0, hi = 0;
    unsigned long long kb = 0;
    if (std::sscanf(line, "%lx-%lx ", &lo, &hi) == 2 && hi > lo) {
      uint64_t inside = 0;
      for (const auto& [begin, end] : ranges) {
        const uintptr_t from = std::max<uintptr_t>(begin, lo), to = std::min<uintptr_t>(end, hi);
        if (to > from) inside += to - from;
      }
      overlap_share = static_cast<double>(inside) / static_cast<double>(hi - lo);
    } else if (std::sscanf(line, "AnonHugePages: %llu kB", &kb) == 1) {
      bytes += overlap_share * static_cast<double>(kb) * 1024;
    }
  }
  std::fclose(f);
  return static_cast<uint64_t>(bytes);
}

struct Aligned {
  std::unique_ptr<std::byte, decltype(&std::free)> ptr{nullptr, &std::free};
  uint64_t bytes = 0;  // allocated (a multiple of 2 MiB)
  std::byte* get() const { return ptr.get(); }
};

// The buffers' pages: 2 MiB (MADV_HUGEPAGE, as the engine's buffers are
// advised; common/huge_pages.h) or 4 KiB (MADV_NOHUGEPAGE, for comparison).
bool g_huge_pages = true;

Aligned alloc_bytes(uint64_t bytes) {
  Aligned a;
  const uint64_t rounded = round_up(std::max<uint64_t>(bytes, 1), kHugePageBytes);
  a.ptr.reset(static_cast<std::byte*>(std::aligned_alloc(kHugePageBytes, rounded)));
  a.bytes = rounded;
  if (!a.get()) {
    std::fprintf(stderr, "strata-adambench: cannot allocate %llu bytes\n", static_cast<unsigned long long>(bytes));
    std::exit(1);
  }
  // Before the first touch. Not advise_huge_pages(): the comparison needs
  // MADV_NOHUGEPAGE too, whatever STRATA_HUGE_PAGES says.
  ::madvise(a.get(), rounded, g_huge_pages ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
  return a;
}

// The twins' loops, each compiled for AVX-512, for AVX2 and for the
// baseline and picked by the CPU at run time (widest_vectors, as the line
// twin is): target_clones would do it, but clang does not take it on
// function templates. Body: a class whose static run(), always inlined, is
// the loop.
template <class Body, class... A>
[[gnu::target("avx512f")]] auto run_avx512(A... a) {
  return Body::run(a...);
}
template <class Body, class... A>
[[gnu::target("avx2")]] auto run_avx2(A... a) {
  return Body::run(a...);
}
template <class Body, class... A>
auto run_widest(A... a) {
  switch (widest_vectors()) {
    case Widest::kAvx512:
      return run_avx512<Body>(a...);
    case Widest::kAvx2:
      return run_avx2<Body>(a...);
    case Widest::kBaseline:
      break;
  }
  return Body::run(a...);
}

// The no-arithmetic twins of a mode. Words: per group of 16 parameters it reads and
// writes exactly the mode's bytes — p, m and v read and written back
// unchanged (xor with `key`, a zero the compiler cannot see, so the stores
// stay), g read (into the low-precision output, or into a checksum when the
// mode writes none) — as 8-byte words the compiler turns into full-width
// vector moves (the output with non-temporal stores, as the optimizer's
// kernels write it). The twins leave the optimizer's buffers as they were:
// an earlier version swapped m with v, and what was timed after it (the
// scalar reference, --with-stats) worked on negative v and NaN weights.
// Built once per instruction set (run_widest) so it runs with the widest
// vectors the CPU has. With kPrefetch, every input stream is also
// prefetched 256 parameters ahead, as the bf16-state loop does
// (cpu_optim/kernels_impl.h; the 8-bit loop prefetches 1024 ahead, the
// fp32-state loop not at all).
template <int kGBytes, int kSBytes, bool kOut, bool kPrefetch>
struct LoopBody {
  [[gnu::always_inline]] static uint64_t run(std::byte* p, const std::byte* g, std::byte* m, std::byte* v,
                                             std::byte* out, int64_t groups, uint64_t key) {
    constexpr int kP = 16 * 4 / 8, kG = 16 * kGBytes / 8, kS = 16 * kSBytes / 8;
    constexpr int64_t kAhead = 256 / 16;  // groups
    uint64_t sink = 0;
    for (int64_t u = 0; u < groups; ++u) {
      if constexpr (kPrefetch) {
        _mm_prefetch(reinterpret_cast<const char*>(p + (u + kAhead) * kP * 8), _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(g + (u + kAhead) * kG * 8), _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(m + (u + kAhead) * kS * 8), _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(v + (u + kAhead) * kS * 8), _MM_HINT_T0);
      }
      uint64_t* pw = reinterpret_cast<uint64_t*>(p) + u * kP;
      const uint64_t* gw = reinterpret_cast<const uint64_t*>(g) + u * kG;
      uint64_t* mw = reinterpret_cast<uint64_t*>(m) + u * kS;
      uint64_t* vw = reinterpret_cast<uint64_t*>(v) + u * kS;
      for (int k = 0; k < kP; ++k) pw[k] ^= key;
      for (int k = 0; k < kS; ++k) mw[k] ^= key;
      for (int k = 0; k < kS; ++k) vw[k] ^= key;
      if constexpr (kOut) {
        // Non-temporal, as the optimizer writes its low-precision copy.
        uint64_t* ow = reinterpret_cast<uint64_t*>(out) + u * kG;
        for (int k = 0; k < kG; ++k)
          _mm_stream_si64(reinterpret_cast<long long*>(ow + k), static_cast<long long>(gw[k]));
      } else {
        for (int k = 0; k < kG; ++k) sink ^= gw[k];
      }
    }
    if constexpr (kOut) _mm_sfence();
    return sink;
  }
};

template <int kGBytes, int kSBytes, bool kOut, bool kPrefetch = false>
uint64_t roofline_loop(std::byte* p, const std::byte* g, std::byte* m, std::byte* v, std::byte* out, int64_t groups,
                       uint64_t key) {
  return run_widest<LoopBody<kGBytes, kSBytes, kOut, kPrefetch>>(p, g, m, v, out, groups, key);
}

__attribute__((target_clones("avx512f", "avx2", "default"))) void triad_loop(float* a, const float* b, const float* c,
                                                                              float s, int64_t n) {
  for (int64_t i = 0; i < n; ++i) a[i] = b[i] + s * c[i];
}

struct Buffers {
  int64_t n;
  Mode mode;
  Aligned p, g, m, v, ms, vs, out;
};

// The sizes of a mode's buffers over n parameters: p, g, m, v, the q8
// scales of m and v, out.
std::array<uint64_t, 7> buffer_sizes(const Mode& mode, int64_t n) {
  const auto un = static_cast<uint64_t>(n);
  const uint64_t sb = state_elem_bytes(mode.state);
  const uint64_t blocks = div_ceil(un, cpu_optim::kQ8BlockElems);
  return {un * 4, un * cpu_optim::dtype_bytes(mode.grad), un * sb, un * sb, blocks * 4, blocks * 4, un * 2};
}

// What make_buffers allocates for the mode (each buffer in whole 2 MiB pages).
uint64_t buffers_bytes(const Mode& mode, int64_t n) {
  uint64_t total = 0;
  for (uint64_t bytes : buffer_sizes(mode, n)) total += round_up(std::max<uint64_t>(bytes, 1), kHugePageBytes);
  return total;
}

Buffers make_buffers(const Mode& mode, int64_t n, Executor& ex) {
  Buffers b{n, mode, {}, {}, {}, {}, {}, {}, {}};
  const uint64_t sb = state_elem_bytes(mode.state);
  const std::array<uint64_t, 7> sizes = buffer_sizes(mode, n);
  for (auto [a, bytes] : {std::pair{&b.p, sizes[0]},
                          {&b.g, sizes[1]},
                          {&b.m, sizes[2]},
                          {&b.v, sizes[3]},
                          {&b.ms, sizes[4]},
                          {&b.vs, sizes[5]},
                          {&b.out, sizes[6]}}) {
    *a = alloc_bytes(bytes);
  }
  // Fill in parallel (first touch from the worker threads).
  ex.parallel_for(n, 1 << 20, [&](int64_t begin, int64_t end) {
    auto* p = reinterpret_cast<float*>(b.p.get());
    for (int64_t i = begin; i < end; ++i) {
      uint32_t h = static_cast<uint32_t>(i) * 2654435761u;
      p[i] = 1.0f + static_cast<float>(h >> 8) * 0x1p-26f;
      float gv = (static_cast<float>(h & 0xFFFF) - 32768.0f) * 0x1p-21f;
      if (mode.grad == DType::kF32) {
        reinterpret_cast<float*>(b.g.get())[i] = gv;
      } else {
        reinterpret_cast<uint16_t*>(b.g.get())[i] = cpu_optim::f32_to_bf16(gv);
      }
    }
    std::memset(b.m.get() + begin * sb, 0, (end - begin) * sb);
    std::memset(b.v.get() + begin * sb, 0, (end - begin) * sb);
    std::memset(b.out.get() + begin * 2, 0, (end - begin) * 2);
  });
  std::memset(b.ms.get(), 0, sizes[4]);
  std::memset(b.vs.get(), 0, sizes[5]);
  return b;
}

// The share of the mode's buffers the kernel backs with huge pages.
double huge_share_of(const Buffers& b) {
  std::vector<std::pair<uintptr_t, uintptr_t>> ranges;
  uint64_t total = 0;
  for (const Aligned* a : {&b.p, &b.g, &b.m, &b.v, &b.ms, &b.vs, &b.out}) {
    const auto begin = reinterpret_cast<uintptr_t>(a->get());
    ranges.emplace_back(begin, begin + a->bytes);
    total += a->bytes;
  }
  return total == 0 ? 0.0 : static_cast<double>(huge_bytes_in(ranges)) / static_cast<double>(total);
}

cpu_optim::ParamSpan span_of(Buffers& b) {
  cpu_optim::ParamSpan s;
  s.params = reinterpret_cast<float*>(b.p.get());
  s.n = b.n;
  s.grad = b.g.get();
  s.grad_dtype = b.mode.grad;
  s.weights_out = b.mode.out ? b.out.get() : nullptr;
  s.out_dtype = DType::kBF16;
  s.state.type = b.mode.state;
  s.state.m = b.m.get();
  s.state.v = b.v.get();
  s.state.m_scale = reinterpret_cast<float*>(b.ms.get());
  s.state.v_scale = reinterpret_cast<float*>(b.vs.get());
  return s;
}

// A second twin, element by element in the mode's own sizes (p, m and v
// written back unchanged, as above; g converted into out — or, in modes
// without out, folded into a checksum so it is still read). The roofline is
// the fastest of the twins: this one, and the word loop with and without
// software prefetch. S is the states' element as an unsigned integer.
template <class G, class S>
struct ElementwiseBody {
  [[gnu::always_inline]] static uint32_t run(uint32_t* p, const G* g, S* m, S* v, uint16_t* out, int64_t n,
                                             uint32_t key) {
    uint32_t sink = 0;
    for (int64_t i = 0; i < n; ++i) {
      p[i] ^= key;
      m[i] = static_cast<S>(m[i] ^ key);
      v[i] = static_cast<S>(v[i] ^ key);
      if (out != nullptr) {
        out[i] = static_cast<uint16_t>(g[i]);
      } else {
        sink ^= std::bit_cast<uint32_t>(static_cast<float>(g[i]));
      }
    }
    return sink;
  }
};
template <class G, class S>
uint32_t roofline_elementwise(uint32_t* p, const G* g, S* m, S* v, uint16_t* out, int64_t n, uint32_t key) {
  return run_widest<ElementwiseBody<G, S>>(p, g, m, v, out, n, key);
}

// Zero, read at run time: the twins' stores cannot be seen to write back
// what they read.
volatile uint32_t opaque_zero = 0;

// One pass of the elementwise twin over the mode's buffers.
std::function<void()> roofline_elementwise_run(Buffers& b, Executor& ex) {
  auto run = [&b, &ex](auto* m, auto* v) -> std::function<void()> {
    return [&b, &ex, m, v] {
      std::atomic<uint32_t> sink{0};
      const uint32_t key = opaque_zero;
      ex.parallel_for(b.n, 1 << 16, [&](int64_t begin, int64_t end) {
        uint16_t* out = b.mode.out ? reinterpret_cast<uint16_t*>(b.out.get()) + begin : nullptr;
        uint32_t* p = reinterpret_cast<uint32_t*>(b.p.get()) + begin;
        if (b.mode.grad == DType::kF32) {
          sink ^= roofline_elementwise(p, reinterpret_cast<const float*>(b.g.get()) + begin, m + begin, v + begin, out,
                                       end - begin, key);
        } else {
          sink ^= roofline_elementwise(p, reinterpret_cast<const uint16_t*>(b.g.get()) + begin, m + begin, v + begin,
                                       out, end - begin, key);
        }
      });
    };
  };
  switch (b.mode.state) {
    case StateType::kF32:
      return run(reinterpret_cast<uint32_t*>(b.m.get()), reinterpret_cast<uint32_t*>(b.v.get()));
    case StateType::kBF16:
      return run(reinterpret_cast<uint16_t*>(b.m.get()), reinterpret_cast<uint16_t*>(b.v.get()));
    case StateType::kQ8: return run(reinterpret_cast<uint8_t*>(b.m.get()), reinterpret_cast<uint8_t*>(b.v.get()));
  }
  return {};
}

// The word loop as a twin (the shape pick_twin takes).
template <bool kPrefetch>
struct Words {
  template <int kGBytes, int kSBytes, bool kOut>
  static uint64_t fn(std::byte* p, const std::byte* g, std::byte* m, std::byte* v, std::byte* out, int64_t groups,
                     uint64_t key) {
    return roofline_loop<kGBytes, kSBytes, kOut, kPrefetch>(p, g, m, v, out, groups, key);
  }
};

// One pass of a twin that moves groups of `group` parameters over the
// mode's buffers; empty when there is none (`loop` null).
std::function<void()> twin_run(Buffers& b, Executor& ex, int64_t group, TwinFn loop) {
  if (loop == nullptr) return {};
  STRATA_CHECK_MSG(b.n % group == 0, "a twin moves whole groups of parameters");
  return [&b, &ex, group, loop] {
    std::atomic<uint64_t> sink{0};
    const uint64_t key = opaque_zero;
    const int64_t gbytes = static_cast<int64_t>(cpu_optim::dtype_bytes(b.mode.grad));
    const int64_t sbytes = static_cast<int64_t>(state_elem_bytes(b.mode.state));
    ex.parallel_for(b.n / group, std::max<int64_t>(1, (int64_t{1} << 16) / group), [&](int64_t begin, int64_t end) {
      const int64_t first = begin * group;
      sink ^= loop(b.p.get() + first * 4, b.g.get() + first * gbytes, b.m.get() + first * sbytes,
                   b.v.get() + first * sbytes, b.out.get() + first * 2, end - begin, key);
    });
  };
}

// A mode's twin of each kind (nullptr: none for these streams or this CPU).
template <class Twin>
TwinFn mode_twin(const Buffers& b) {
  return pick_twin<Twin>(static_cast<int>(cpu_optim::dtype_bytes(b.mode.grad)),
                         static_cast<int>(state_elem_bytes(b.mode.state)), b.mode.out);
}
TwinFn mode_lines_twin(const Buffers& b) {
  return roofline_lines(static_cast<int>(cpu_optim::dtype_bytes(b.mode.grad)),
                        static_cast<int>(state_elem_bytes(b.mode.state)), b.mode.out);
}

// --show-twins: each twin's time, not only the fastest.
bool g_show_twins = false;

// A mode's step and its no-arithmetic twins, in that order: what
// interleaved_median_seconds times, so that the step and its roofline see
// the same stretch of the machine's time.
constexpr size_t kTimedPerMode = 5;
std::array<std::function<void()>, kTimedPerMode> step_and_twins(std::function<void()> step, Buffers& b, Executor& ex) {
  return {std::move(step), twin_run(b, ex, 16, mode_twin<Words<false>>(b)),
          twin_run(b, ex, 16, mode_twin<Words<true>>(b)), roofline_elementwise_run(b, ex),
          twin_run(b, ex, 64, mode_lines_twin(b))};
}

// The step's median and the roofline (the fastest twin's median) from
// step_and_twins' kTimedPerMode medians starting at `t`.
struct StepTimes {
  double step = 0, roofline = 0;
  size_t roofline_twin = 1;  // which of the kTimedPerMode the roofline is
};
StepTimes step_times(const double* t) {
  if (g_show_twins) {
    std::printf("  twins (s): words %.4f, prefetched %.4f, elementwise %.4f, lines %.4f\n", t[1], t[2], t[3], t[4]);
  }
  const double* fastest = std::min_element(t + 1, t + kTimedPerMode);
  return {t[0], *fastest, static_cast<size_t>(fastest - t)};
}

// Slowest over fastest of one function's rounds (1 for fewer than two).
double round_spread(const std::vector<double>& rounds) {
  if (rounds.size() < 2) return 1.0;
  const auto [lo, hi] = std::minmax_element(rounds.begin(), rounds.end());
  return *lo > 0 ? *hi / *lo : 1.0;
}
// Above this spread of its step's or roofline's rounds a row says that the
// machine's speed changed while it was timed.
constexpr double kNoticeableSpread = 1.25;

// What `threads` of the cores compute in cache, alone (the fastest of the
// core check's figures, one per thread), over `roof_params_per_s`, the
// parameters/s a roofline moves: under 1 the arithmetic alone cannot keep
// up with that memory. 0 without a core check.
double cores_vs_roofline(const std::vector<std::pair<int, double>>& speeds, int threads, double roof_params_per_s) {
  std::vector<double> fastest;
  for (const auto& cpu_speed : speeds) fastest.push_back(cpu_speed.second);
  std::sort(fastest.rbegin(), fastest.rend());
  fastest.resize(std::min(fastest.size(), static_cast<size_t>(threads)));
  double ceiling = 0;
  for (double f : fastest) ceiling += f;
  return ceiling / roof_params_per_s;
}

double triad_gbps(int64_t n, Executor& ex, int reps) {
  Aligned a = alloc_bytes(n * 4), b = alloc_bytes(n * 4), c = alloc_bytes(n * 4);
  ex.parallel_for(n, 1 << 20, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      reinterpret_cast<float*>(a.get())[i] = 0;
      reinterpret_cast<float*>(b.get())[i] = 1;
      reinterpret_cast<float*>(c.get())[i] = 2;
    }
  });
  double s = median_seconds(reps, [&] {
    ex.parallel_for(n, 1 << 16, [&](int64_t begin, int64_t end) {
      triad_loop(reinterpret_cast<float*>(a.get()) + begin, reinterpret_cast<const float*>(b.get()) + begin,
                 reinterpret_cast<const float*>(c.get()) + begin, 3.0f, end - begin);
    });
  });
  return 12.0 * static_cast<double>(n) / s / 1e9;
}

// The low-precision-state modes against offload at one thread count (rows
// from `first`): their parameters/s over offload's, and the same ratio for
// their rooflines — what the memory allows them, since streams of other
// widths need not move at the same GB/s. Printed and added to the rows.
void print_vs_offload(nlohmann::json& rows, size_t first) {
  const nlohmann::json* offload = nullptr;
  for (size_t i = first; i < rows.size(); ++i) {
    if (rows[i]["mode"] == "offload") offload = &rows[i];
  }
  if (offload == nullptr) return;
  auto roof_params = [](const nlohmann::json& r) {
    return r["roofline_gbps"].get<double>() / r["bytes_per_param"].get<double>();
  };
  for (size_t i = first; i < rows.size(); ++i) {
    nlohmann::json& r = rows[i];
    if (r["mode"] != "bf16_state" && r["mode"] != "q8_state") continue;
    const double vs = r["params_per_s"].get<double>() / (*offload)["params_per_s"].get<double>();
    const double roof_vs = roof_params(r) / roof_params(*offload);
    std::printf("%-10s %3d   %.3f x offload's params/s (their rooflines: %.3f x)\n",
                r["mode"].get<std::string>().c_str(), r["threads"].get<int>(), vs, roof_vs);
    r["params_per_s_vs_offload"] = vs;
    r["roofline_params_per_s_vs_offload"] = roof_vs;
  }
  std::fflush(stdout);
}

// One AdamW step over the span as the benchmark times it (non-finite
// values reported, not refused); a failure ends the program.
void adam_step(const cpu_optim::AdamConfig& adamw, int64_t t, const cpu_optim::ParamSpan& span, Isa isa, Executor& ex,
               cpu_optim::GradStats* stats = nullptr) {
  cpu_optim::StepOptions o;
  o.isa = isa;
  o.nonfinite = cpu_optim::NonFinitePolicy::kReportOnly;
  o.stats = stats;
  Result<cpu_optim::StepReport> r = cpu_optim::step(adamw, t, span, o, ex);
  if (!r) exit_on_error(r.error(), "strata-adambench");
}

// Each CPU this process may run on, in turn: the mode's parameters/s in
// cache with one thread pinned there (CPU number -> params/s). On a shared
// host one core can run much slower than another (another guest on its
// physical core), which the all-core rows then feel; this says so.
std::vector<std::pair<int, double>> core_speeds(const Mode& mode, const cpu_optim::AdamConfig& adamw, Isa isa) {
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (::sched_getaffinity(0, sizeof allowed, &allowed) != 0) return {};
  constexpr int64_t kN = int64_t{1} << 15;  // under 1 MiB of buffers in every mode: in cache
  std::vector<std::pair<int, double>> speeds;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (!CPU_ISSET(cpu, &allowed)) continue;
    double seconds = 0;
    std::thread pinned([&] {
      cpu_set_t one;
      CPU_ZERO(&one);
      CPU_SET(cpu, &one);
      if (::pthread_setaffinity_np(::pthread_self(), sizeof one, &one) != 0) return;
      Result<std::unique_ptr<Executor>> ex = Executor::create({1, -1});
      if (!ex) return;
      Buffers b = make_buffers(mode, kN, **ex);
      const cpu_optim::ParamSpan span = span_of(b);
      int64_t t = 0;
      seconds = median_seconds(50, [&] { adam_step(adamw, ++t, span, isa, **ex); });
    });
    pinned.join();
    if (seconds > 0) speeds.emplace_back(cpu, static_cast<double>(kN) / seconds);
  }
  return speeds;
}

int run(int argc, char** argv) {
  CLI::App app{"strata-adambench: CPU AdamW throughput against a same-streams roofline, STREAM triad and naive loop"};
  int log2_params = 27;
  std::vector<int> thread_counts;
  std::vector<std::string> mode_names = {"offload", "fp32", "bf16_state", "q8_state"};
  int reps = 5;
  bool skip_naive = false;
  bool with_stats = false;
  bool skip_core_check = false;
  std::string isa_text = "auto";
  std::string pages = "huge";
  double eps = 1e-8;
  app.add_option("--log2-params", log2_params, "parameters = 2^N")->capture_default_str()->check(CLI::Range(10, 32));
  app.add_option(
      "--threads", thread_counts,
      "thread counts (default: 1 and all cores; 0 is all cores, and more than the cores online run on all of them)");
  app.add_option("--modes", mode_names, "offload, fp32, bf16_state, q8_state")->capture_default_str();
  app.add_option("--reps", reps, "timed repetitions (median kept)")->capture_default_str()->check(CLI::Range(1, 100));
  app.add_flag("--skip-naive", skip_naive, "do not time the scalar reference (slow)");
  app.add_flag("--with-stats", with_stats,
               "also time the step with the gradient statistics (the global norm's sum of squares): a separate "
               "grad_stats pass before it against StepOptions::stats in the update's own pass");
  app.add_flag("--skip-core-check", skip_core_check,
               "do not time each core alone first (one pinned thread, the most arithmetic-heavy mode, in cache)");
  app.add_flag("--show-twins", g_show_twins,
               "print each no-arithmetic twin's time (word loop, with prefetch, element-wise, 64-byte lines) before "
               "its row");
  app.add_option("--isa", isa_text, "instruction set: auto, avx512_bf16, avx512, avx2, sse2, scalar")
      ->capture_default_str();
  app.add_option("--pages", pages,
                 "the buffers' pages: huge (2 MiB, MADV_HUGEPAGE, as the engine advises its buffers) or 4k "
                 "(MADV_NOHUGEPAGE)")
      ->capture_default_str()
      ->check(CLI::IsMember({"huge", "4k"}));
  app.add_option("--eps", eps,
                 "AdamW's eps (an eps times sqrt(1 - beta2^t) below 2^-49, e.g. 0, takes the exact roots and "
                 "divisions: slower)")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  g_huge_pages = pages == "huge";
  cpu_optim::AdamConfig adamw;
  adamw.weight_decay = 0.01f;
  adamw.eps = eps;
  if (const Status valid = cpu_optim::validate(adamw); !valid.ok()) {
    std::fprintf(stderr, "strata-adambench: --eps: %s\n", valid.to_string().c_str());
    return 2;
  }
  Result<Isa> parsed = cpu_optim::parse_isa(isa_text);
  if (!parsed) {
    std::fprintf(stderr, "strata-adambench: --isa: %s\n", parsed.error().to_string().c_str());
    return 2;
  }
  const Isa isa = *parsed;
  if (thread_counts.empty()) {
    thread_counts = {1};
    if (cpu_optim::hardware_threads() > 1) thread_counts.push_back(cpu_optim::hardware_threads());
  }
  std::vector<Mode> modes;
  for (const std::string& name : mode_names) {
    const Mode* m =
        std::find_if(std::begin(kAdamModes), std::end(kAdamModes), [&](const Mode& k) { return k.name == name; });
    if (m == std::end(kAdamModes)) {
      std::fprintf(stderr, "strata-adambench: unknown mode '%s'\n", name.c_str());
      return 2;
    }
    modes.push_back(*m);
  }
  const int64_t n = int64_t{1} << log2_params;
  std::vector<Isa> isas = cpu_optim::available_isas();
  std::string isa_used(cpu_optim::isa_name(isa == Isa::kAuto ? isas.front() : isa));
  std::printf(
      "strata-adambench: AdamW (eps %g) on 2^%d = %lld parameters, ISA %s, %d cores, median of %d steps, %s pages\n",
      eps, log2_params, static_cast<long long>(n), isa_used.c_str(), cpu_optim::hardware_threads(), reps,
      g_huge_pages ? "2 MiB" : "4 KiB");
  nlohmann::json rows = nlohmann::json::array();
  // The cores' speeds, with the most arithmetic-heavy mode asked for.
  const Mode& probe = *std::max_element(modes.begin(), modes.end(), [](const Mode& a, const Mode& b) {
    return static_cast<int>(a.state) < static_cast<int>(b.state);
  });
  nlohmann::json cores = nlohmann::json::object();
  // Each mode's cores too (milliseconds each), for its rows' arithmetic
  // against their roofline; the probe's are the ones printed here.
  std::map<const Mode*, std::vector<std::pair<int, double>>> mode_speeds;
  if (!skip_core_check) {
    for (const Mode& mode : modes) mode_speeds[&mode] = core_speeds(mode, adamw, isa);
  }
  const std::vector<std::pair<int, double>>& speeds = mode_speeds[&probe];
  if (!speeds.empty()) {
    double lo = speeds[0].second, hi = speeds[0].second;
    std::printf("core speeds (%.*s in cache, one pinned thread, params/s):", static_cast<int>(probe.name.size()),
                probe.name.data());
    for (const auto& [cpu, speed] : speeds) {
      std::printf(" cpu%d %.2e", cpu, speed);
      lo = std::min(lo, speed);
      hi = std::max(hi, speed);
      cores[std::to_string(cpu)] = speed;
    }
    std::printf("; slowest / fastest %.2f%s\n", lo / hi,
                lo / hi < 0.9 ? " (unequal: something else runs on the slow core — another guest of a shared host? "
                                "All-core figures vary with it)"
                              : "");
  }
  // The modes timed together: all of them, in the same rounds, where their
  // buffers fit in the memory the machine has free — on a host whose
  // memory speed swings from second to second, modes timed one after
  // another meet different memory, and their ratios to each other
  // (bf16_state and q8_state against offload) say more about when each ran
  // than about the modes; else each mode alone, and the output says so.
  std::vector<std::vector<const Mode*>> groups;
  {
    uint64_t together = 0;
    for (const Mode& mode : modes) together += buffers_bytes(mode, n);
    const uint64_t available = available_memory_bytes();
    if (modes.size() > 1 && available > 0 && together > available / 10 * 9) {
      std::printf(
          "(the modes' buffers together, %s, are over 90%% of the %s free: each mode is timed alone, so their "
          "figures against each other compare different moments)\n",
          format_bytes(together).c_str(), format_bytes(available).c_str());
      for (const Mode& mode : modes) groups.push_back({&mode});
    } else {
      groups.emplace_back();
      for (const Mode& mode : modes) groups.back().push_back(&mode);
    }
  }
  std::printf("%-10s %3s %9s %10s %7s %9s %7s %7s %9s %7s\n", "mode", "thr", "s/step", "params/s", "GB/s", "roof GB/s",
              "ratio", "triad", "vs naive", "huge pg");
  for (int threads : thread_counts) {
    auto ex_r = Executor::create({threads, -1});
    if (!ex_r) {
      std::fprintf(stderr, "strata-adambench: %s\n", ex_r.error().to_string().c_str());
      return 1;
    }
    Executor& ex = **ex_r;
    double triad = triad_gbps(n / 2, ex, reps);
    const size_t first_row = rows.size();
    for (const std::vector<const Mode*>& group : groups) {
      struct ModeRun {
        const Mode* mode;
        Buffers b;
        cpu_optim::ParamSpan span;
        int64_t t = 0;
      };
      std::vector<std::unique_ptr<ModeRun>> runs;
      std::vector<std::function<void()>> timed;
      for (const Mode* mode : group) {
        auto& r = *runs.emplace_back(std::make_unique<ModeRun>(ModeRun{mode, make_buffers(*mode, n, ex), {}}));
        r.span = span_of(r.b);
        for (auto& fn : step_and_twins([&r, &adamw, isa, &ex] { adam_step(adamw, ++r.t, r.span, isa, ex); }, r.b, ex)) {
          timed.push_back(std::move(fn));
        }
      }
      if (group.size() > 1) {
        std::printf("(%d threads: %zu modes, their steps and twins timed in %d rounds)\n", ex.threads(), group.size(),
                    reps);
        std::fflush(stdout);
      }
      const std::vector<std::vector<double>> rounds = interleaved_round_seconds(reps, timed);
      const std::vector<double> medians = round_medians(rounds);
      for (size_t k = 0; k < runs.size(); ++k) {
        ModeRun& run = *runs[k];
        const Mode& mode = *run.mode;
        Buffers& b = run.b;
        const double huge_share = huge_share_of(b);
        cpu_optim::ParamSpan& span = run.span;
        auto step_with = [&](Isa which, cpu_optim::GradStats* stats = nullptr) {
          adam_step(adamw, ++run.t, span, which, ex, stats);
        };
        const StepTimes times = step_times(medians.data() + k * kTimedPerMode);
        const double s = times.step, roof = times.roofline;
        const double step_spread = round_spread(rounds[k * kTimedPerMode]);
        const double roof_spread = round_spread(rounds[k * kTimedPerMode + times.roofline_twin]);
        double naive = skip_naive ? 0 : median_seconds(1, [&] { step_with(Isa::kScalar); });
        const std::string name(mode.name);
        const double bytes_per_param = adam_bytes_per_param(mode);
        double bytes = bytes_per_param * static_cast<double>(n);
        double gbps = bytes / s / 1e9, roof_gbps = bytes / roof / 1e9;
        std::printf("%-10s %3d %9.4f %10.3e %7.2f %9.2f %7.3f %7.2f %9.2f %6.0f%%\n", name.c_str(), ex.threads(), s,
                    static_cast<double>(n) / s, gbps, roof_gbps, gbps / roof_gbps, triad, naive > 0 ? naive / s : 0.0,
                    100 * huge_share);
        const double ceiling_vs_roof =
            cores_vs_roofline(mode_speeds[&mode], ex.threads(), roof_gbps * 1e9 / bytes_per_param);
        if (ceiling_vs_roof > 0) {
          std::printf("  (its cores in cache, alone: %.2fx the parameters/s this roofline moves%s)\n", ceiling_vs_roof,
                      ceiling_vs_roof < 1.0 ? " — the arithmetic alone cannot keep up with this memory" : "");
        }
        if (step_spread > kNoticeableSpread || roof_spread > kNoticeableSpread) {
          std::printf("  (its rounds: the step's slowest %.2fx its fastest, the roofline's %.2fx — the machine's speed "
                      "changed while they ran; the ratio is of medians)\n",
                      step_spread, roof_spread);
        }
        std::fflush(stdout);
        nlohmann::json row = {{"mode", name},
                              {"threads", ex.threads()},
                              {"seconds_per_step", s},
                              {"params_per_s", static_cast<double>(n) / s},
                              {"bytes_per_param", bytes_per_param},
                              {"gbps", gbps},
                              {"roofline_gbps", roof_gbps},
                              {"ratio_to_roofline", gbps / roof_gbps},
                              {"triad_gbps", triad},
                              {"huge_page_share", huge_share},
                              {"step_round_spread", step_spread},
                              {"roofline_round_spread", roof_spread}};
        if (naive > 0) row["speedup_vs_naive"] = naive / s;
        if (ceiling_vs_roof > 0) row["arithmetic_vs_roofline"] = ceiling_vs_roof;
        if (with_stats) {
          // What an engine that updates before it knows the global norm pays
          // for the norm: a read-only pass over the gradient first, or a fused
          // multiply-add per batch in the update's own pass.
          auto with_separate_pass = [&] {
            auto g = cpu_optim::grad_stats(span.grad, span.grad_dtype, span.n, 1.0f, ex, isa);
            if (!g) exit_on_error(g.error(), "strata-adambench");
            step_with(isa);
          };
          auto fused_in_update = [&] {
            cpu_optim::GradStats g;
            step_with(isa, &g);
          };
          const std::vector<double> both = interleaved_median_seconds(reps, {with_separate_pass, fused_in_update});
          const double separate = both[0], fused = both[1];
          std::printf(
              "%-10s %3d   with the gradient statistics: separate pass %.4f s, in the update %.4f s "
              "(%.3f x; the step alone %.4f s)\n",
              name.c_str(), ex.threads(), separate, fused, separate / fused, s);
          std::fflush(stdout);
          row["seconds_with_separate_stats"] = separate;
          row["seconds_with_fused_stats"] = fused;
        }
        rows.push_back(row);
      }
    }
    print_vs_offload(rows, first_row);
  }
  nlohmann::json j = {{"bench", "adam"},         {"params", n}, {"isa", isa_used},
                      {"system", system_info()}, {"eps", eps},  {"rows", rows}};
  if (!cores.empty()) {
    j["core_probe_mode"] = std::string(probe.name);
    j["core_params_per_s"] = cores;
  }
  std::printf("%s\n", j.dump().c_str());
  return 0;
}

}  // namespace
}  // namespace strata::bench

int main(int argc, char** argv) { return strata::bench::run(argc, argv); }
