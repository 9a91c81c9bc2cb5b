// roofline_lines.h's twin in AVX2 registers (compiled with -mavx2), two per line.
#include "bench/roofline_lines.h"

namespace strata::bench {
namespace {

struct Avx2Lines {
  struct L {
    __m256i lo, hi;
  };
  static L broadcast(uint64_t w) {
    const __m256i b = _mm256_set1_epi64x(static_cast<long long>(w));
    return {b, b};
  }
  static L xor_(L a, L b) { return {_mm256_xor_si256(a.lo, b.lo), _mm256_xor_si256(a.hi, b.hi)}; }
  static L load(const std::byte* a) {
    return {_mm256_load_si256(reinterpret_cast<const __m256i*>(a)),
            _mm256_load_si256(reinterpret_cast<const __m256i*>(a + 32))};
  }
  static void store(std::byte* a, L l) {
    _mm256_store_si256(reinterpret_cast<__m256i*>(a), l.lo);
    _mm256_store_si256(reinterpret_cast<__m256i*>(a + 32), l.hi);
  }
  static void stream(std::byte* a, L l) {
    _mm256_stream_si256(reinterpret_cast<__m256i*>(a), l.lo);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(a + 32), l.hi);
  }
  static uint64_t fold(L l) {
    alignas(32) uint64_t w[4];
    _mm256_store_si256(reinterpret_cast<__m256i*>(w), _mm256_or_si256(l.lo, l.hi));
    return w[0] | w[1] | w[2] | w[3];
  }
};

}  // namespace

TwinFn roofline_lines_avx2(int g_bytes, int s_bytes, bool out) {
  return pick_twin<lines_detail::Lines<Avx2Lines>>(g_bytes, s_bytes, out);
}

}  // namespace strata::bench
