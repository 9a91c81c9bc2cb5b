// strata-adambench's line twin, the fourth no-arithmetic twin: per group
// of 64 parameters every stream is a whole number of 64-byte lines (p 4, g 2
// or 4, m and v 1, 2 or 4, out 2), each loaded, xor-ed with `key` and stored
// back with full-width vector instructions (one per line with AVX-512, two
// with AVX2), the output with non-temporal vector stores — the fewest
// instructions that move a mode's bytes (the word twin moves the 8-bit
// modes' byte streams 8 bytes at a time). Compiled once per instruction set
// (roofline_lines_avx512.cpp, roofline_lines_avx2.cpp, each with its flags);
// the caller picks one the CPU has.
#pragma once

#include <immintrin.h>

#include <cstddef>
#include <cstdint>

namespace strata::bench {

// A twin: (p, g, m, v, out, groups of parameters, key) -> a checksum of
// what was only read. The line twins' groups are 64 parameters, and their
// streams start on 64-byte boundaries.
using TwinFn = uint64_t (*)(std::byte* p, const std::byte* g, std::byte* m, std::byte* v, std::byte* out,
                            int64_t groups, uint64_t key);

// The twin for gradients of g_bytes (2, 4), states of s_bytes (1, 2, 4) and
// with or without the 2-byte output; nullptr for another combination.
TwinFn roofline_lines_avx512(int g_bytes, int s_bytes, bool out);
TwinFn roofline_lines_avx2(int g_bytes, int s_bytes, bool out);

// The widest vectors this CPU runs, for the twins built once per
// instruction set (these, and strata-adambench's run_widest).
enum class Widest { kAvx512, kAvx2, kBaseline };
inline Widest widest_vectors() {
  static const Widest w = __builtin_cpu_supports("avx512f") ? Widest::kAvx512
                          : __builtin_cpu_supports("avx2")  ? Widest::kAvx2
                                                            : Widest::kBaseline;
  return w;
}

// The widest of the line twins this CPU runs (nullptr without AVX2).
inline TwinFn roofline_lines(int g_bytes, int s_bytes, bool out) {
  switch (widest_vectors()) {
    case Widest::kAvx512:
      return roofline_lines_avx512(g_bytes, s_bytes, out);
    case Widest::kAvx2:
      return roofline_lines_avx2(g_bytes, s_bytes, out);
    case Widest::kBaseline:
      break;
  }
  return nullptr;
}

namespace lines_detail {

// The twin over Ops: broadcast, xor_, load, store, stream (non-temporal)
// and fold of one 64-byte line in the instruction set's registers.
template <class Ops>
struct Lines {
  template <int kGBytes, int kSBytes, bool kOut>
  static uint64_t fn(std::byte* p, const std::byte* g, std::byte* m, std::byte* v, std::byte* out, int64_t groups,
                     uint64_t key) {
    constexpr int kP = 4, kG = kGBytes, kS = kSBytes;  // lines per group
    const auto k = Ops::broadcast(key);
    auto sink = Ops::broadcast(0);
    auto xor_back = [&](std::byte* base, int64_t line) {
      Ops::store(base + line * 64, Ops::xor_(Ops::load(base + line * 64), k));
    };
    for (int64_t u = 0; u < groups; ++u) {
      for (int i = 0; i < kP; ++i) xor_back(p, u * kP + i);
      for (int i = 0; i < kS; ++i) xor_back(m, u * kS + i);
      for (int i = 0; i < kS; ++i) xor_back(v, u * kS + i);
      for (int i = 0; i < kG; ++i) {
        const auto x = Ops::load(g + (u * kG + i) * 64);
        if constexpr (kOut) {
          // Two bytes out per parameter: the first two of the gradient's lines.
          if (i < 2) Ops::stream(out + (u * 2 + i) * 64, x);
        } else {
          sink = Ops::xor_(sink, x);
        }
      }
    }
    if constexpr (kOut) _mm_sfence();
    return Ops::fold(sink);
  }
};

}  // namespace lines_detail

// Twin::fn<gradient bytes, state bytes, output> for a mode's streams: the
// instantiations strata-adambench's modes use; nullptr for another
// combination.
template <class Twin>
TwinFn pick_twin(int g_bytes, int s_bytes, bool out) {
  if (g_bytes == 2 && s_bytes == 4) return out ? Twin::template fn<2, 4, true> : Twin::template fn<2, 4, false>;
  if (g_bytes == 4 && s_bytes == 4) return out ? Twin::template fn<4, 4, true> : Twin::template fn<4, 4, false>;
  if (g_bytes == 2 && s_bytes == 2 && out) return Twin::template fn<2, 2, true>;
  if (g_bytes == 2 && s_bytes == 1 && out) return Twin::template fn<2, 1, true>;
  return nullptr;
}

}  // namespace strata::bench
