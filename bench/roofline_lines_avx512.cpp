// roofline_lines.h's twin in AVX-512 registers (compiled with -mavx512f).
#include "bench/roofline_lines.h"

namespace strata::bench {
namespace {

struct Avx512Lines {
  static __m512i broadcast(uint64_t w) { return _mm512_set1_epi64(static_cast<long long>(w)); }
  static __m512i xor_(__m512i a, __m512i b) { return _mm512_xor_si512(a, b); }
  static __m512i load(const std::byte* a) { return _mm512_load_si512(a); }
  static void store(std::byte* a, __m512i x) { _mm512_store_si512(a, x); }
  static void stream(std::byte* a, __m512i x) { _mm512_stream_si512(reinterpret_cast<__m512i*>(a), x); }
  static uint64_t fold(__m512i x) { return static_cast<uint64_t>(_mm512_reduce_or_epi64(x)); }
};

}  // namespace

TwinFn roofline_lines_avx512(int g_bytes, int s_bytes, bool out) {
  return pick_twin<lines_detail::Lines<Avx512Lines>>(g_bytes, s_bytes, out);
}

}  // namespace strata::bench
