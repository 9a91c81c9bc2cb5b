// Per-architecture lane operations for the cpu_optim vector kernels: the
// narrowing and widening moves xsimd 8 lacks (fp16 via F16C, bf16), typed
// batch loads/stores (optionally non-temporal), and sqrt / reciprocal
// through the FMA ports. Specialised for the AVX-512 and AVX2 batches; kernels for other
// architectures use scalar conversions instead (has_lane_moves() is false).
// Every conversion here is bit-identical to its scalar twin in dtype.h.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <limits>
#include <type_traits>
#include <xsimd/xsimd.hpp>

#include "cpu_optim/dtype.h"

namespace strata::cpu_optim::detail {

// Narrow/wide element moves the vector kernels need and xsimd 8 lacks, one
// batch at a time; specialised for the AVX-512 and AVX2 batches (F16C for
// fp16). Other architectures take the scalar paths of the callers.
template <class Arch>
constexpr bool is_avx512() {
  return std::is_base_of_v<xsimd::avx512f, Arch>;
}
template <class Arch>
constexpr bool has_lane_moves() {
  return is_avx512<Arch>() || std::is_base_of_v<xsimd::avx2, Arch>;
}

template <class Arch>
xsimd::batch<float, Arch> load_f16(const uint16_t* src) {
  if constexpr (is_avx512<Arch>()) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src)));
  } else {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src)));
  }
}

// Stores one batch of 2-byte lanes; kStream: non-temporal (no read for
// ownership, around the caches; dst aligned to the batch's bytes, and an
// _mm_sfence before another thread reads it).
template <bool kStream>
void put_lanes(uint16_t* dst, __m256i lanes) {
  if constexpr (kStream) {
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst), lanes);
  } else {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst), lanes);
  }
}
template <bool kStream>
void put_lanes(uint16_t* dst, __m128i lanes) {
  if constexpr (kStream) {
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst), lanes);
  } else {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst), lanes);
  }
}

template <class Arch, bool kStream = false>
void store_f16(const xsimd::batch<float, Arch>& x, uint16_t* dst) {
  constexpr int kMode = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  if constexpr (is_avx512<Arch>()) {
    put_lanes<kStream>(dst, _mm512_cvtps_ph(x, kMode));
  } else {
    put_lanes<kStream>(dst, _mm256_cvtps_ph(x, kMode));
  }
}

template <class Arch>
xsimd::batch<float, Arch> load_bf16(const uint16_t* src) {
  if constexpr (is_avx512<Arch>()) {
    // One word permutation puts word k in the high half of dword k and
    // zeroes the low halves: the fp32 bits, where a widening move and a
    // shift (on the one port that shifts 512-bit lanes) take two.
    const __m512i high_halves =
        _mm512_set_epi32(15 << 16, 14 << 16, 13 << 16, 12 << 16, 11 << 16, 10 << 16, 9 << 16, 8 << 16, 7 << 16, 6 << 16,
                         5 << 16, 4 << 16, 3 << 16, 2 << 16, 1 << 16, 0);
    const __m512i w = _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src)));
    return _mm512_castsi512_ps(_mm512_maskz_permutexvar_epi16(0xAAAAAAAAu, high_halves, w));
  } else {
    __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
  }
}

// Round to nearest even; NaN -> quiet NaN keeping sign and top payload
// (f32_to_bf16). `native`: with vcvtneps2bf16 where no lane is subnormal
// (TileKernel::native_bf16).
template <class Arch, bool kStream = false>
[[gnu::always_inline]] inline void store_bf16(const xsimd::batch<float, Arch>& x, uint16_t* dst, bool native) {
  if constexpr (is_avx512<Arch>()) {
    if (native && _mm512_fpclass_ps_mask(x, 0x20 /* subnormal */) == 0) {
      put_lanes<kStream>(dst, reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(x)));
      return;
    }
    __m512i u = _mm512_castps_si512(x);
    __m512i hi = _mm512_srli_epi32(u, 16);
    __m512i lsb = _mm512_and_si512(hi, _mm512_set1_epi32(1));
    __m512i r = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7FFF)), lsb), 16);
    __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    r = _mm512_mask_or_epi32(r, nan, hi, _mm512_set1_epi32(0x40));  // NaN lanes: quieted, truncated
    put_lanes<kStream>(dst, _mm512_cvtepi32_epi16(r));
  } else {
    __m256i u = _mm256_castps_si256(x);
    __m256i hi = _mm256_srli_epi32(u, 16);
    __m256i lsb = _mm256_and_si256(hi, _mm256_set1_epi32(1));
    __m256i r = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7FFF)), lsb), 16);
    __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
    r = _mm256_blendv_epi8(r, _mm256_or_si256(hi, _mm256_set1_epi32(0x40)), nan);
    put_lanes<kStream>(dst, _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1)));
  }
}

// One batch of element i.. of a typed stream, as fp32.
template <class Arch>
xsimd::batch<float, Arch> load_as_f32(const void* base, DType t, int64_t i) {
  switch (t) {
    case DType::kF32: return xsimd::batch<float, Arch>::load_unaligned(static_cast<const float*>(base) + i);
    case DType::kBF16: return load_bf16<Arch>(static_cast<const uint16_t*>(base) + i);
    case DType::kF16: break;
  }
  return load_f16<Arch>(static_cast<const uint16_t*>(base) + i);
}

template <class Arch>
[[gnu::always_inline]] inline void store_from_f32(void* base, DType t, int64_t i, const xsimd::batch<float, Arch>& x,
                                                  bool native_bf16) {
  switch (t) {
    case DType::kF32: x.store_unaligned(static_cast<float*>(base) + i); return;
    case DType::kBF16:
      store_bf16<Arch>(x, static_cast<uint16_t*>(base) + i, native_bf16);
      return;
    case DType::kF16: store_f16<Arch>(x, static_cast<uint16_t*>(base) + i); return;
  }
}

// a * b + c (fused_fma) and c - a * b (fused_fnma) rounded once. xsimd 8
// has no AVX-512 fma kernel: its generic fallback multiplies and adds,
// which GCC fuses at -O2 and above but not below, so the kernels call these
// instead and compute the same bits at every optimisation level. (SSE2 has
// no fused instruction: there xsimd's multiply-and-add is what runs.)
template <class Arch>
xsimd::batch<float, Arch> fused_fma(const xsimd::batch<float, Arch>& a, const xsimd::batch<float, Arch>& b,
                                    const xsimd::batch<float, Arch>& c) {
  if constexpr (is_avx512<Arch>()) {
    return _mm512_fmadd_ps(a, b, c);
  } else {
    return xsimd::fma(a, b, c);
  }
}
template <class Arch>
xsimd::batch<float, Arch> fused_fnma(const xsimd::batch<float, Arch>& a, const xsimd::batch<float, Arch>& b,
                                     const xsimd::batch<float, Arch>& c) {
  if constexpr (is_avx512<Arch>()) {
    return _mm512_fnmadd_ps(a, b, c);
  } else {
    return xsimd::fnma(a, b, c);
  }
}

// The bare hardware estimates of 1/sqrt(x) and 1/x (14 bits on AVX-512, 12
// on AVX2; rsqrt(0) = inf, rcp(inf) = 0): what coarse_* below return, and
// the start of fast_*'s Newton step.
template <class Arch>
xsimd::batch<float, Arch> rsqrt_estimate(const xsimd::batch<float, Arch>& x) {
  if constexpr (is_avx512<Arch>()) {
    return _mm512_rsqrt14_ps(x);
  } else {
    return _mm256_rsqrt_ps(x);
  }
}
template <class Arch>
xsimd::batch<float, Arch> rcp_estimate(const xsimd::batch<float, Arch>& x) {
  if constexpr (is_avx512<Arch>()) {
    return _mm512_rcp14_ps(x);
  } else {
    return _mm256_rcp_ps(x);
  }
}

// sqrt(x) = 1 / rsqrt(x) and 1/x from the bare estimates (no Newton step;
// sqrt(0) = 0, sqrt(inf) = inf); exact instructions on other architectures.
template <class Arch>
xsimd::batch<float, Arch> coarse_sqrt(const xsimd::batch<float, Arch>& x) {
  if constexpr (has_lane_moves<Arch>()) {
    return rcp_estimate<Arch>(rsqrt_estimate<Arch>(x));
  } else {
    return xsimd::sqrt(x);
  }
}
template <class Arch>
xsimd::batch<float, Arch> coarse_reciprocal(const xsimd::batch<float, Arch>& x) {
  if constexpr (has_lane_moves<Arch>()) {
    return rcp_estimate<Arch>(x);
  } else {
    return xsimd::batch<float, Arch>(1.0f) / x;
  }
}

// vfixupimmps (AVX-512): per lane, what replaces a result, chosen by the
// class of the input. A table holds one response per class, in the
// instruction's class order.
enum class Fixup : uint32_t { kKeep = 0, kInput = 1, kQuietInput = 2, kSignedInf = 6, kMinusZero = 7, kPlusZero = 8 };
struct FixupByClass {
  Fixup qnan, snan, zero, one, minus_inf, plus_inf, negative, positive;
};
constexpr int32_t fixup_table(const FixupByClass& f) {
  const Fixup order[] = {f.qnan, f.snan, f.zero, f.one, f.minus_inf, f.plus_inf, f.negative, f.positive};
  uint32_t table = 0;
  for (int i = 0; i < 8; ++i) table |= static_cast<uint32_t>(order[i]) << (4 * i);
  return static_cast<int32_t>(table);
}
template <FixupByClass kF>
__m512 fixup(__m512 result, __m512 input) {
  return _mm512_fixupimm_ps(result, input, _mm512_set1_epi32(fixup_table(kF)), 0);
}
// fast_sqrt's: NaN and +-inf are x itself, +-0 is +0. fast_reciprocal's:
// as division — NaN x (quieted), +-0 -> +-inf, -inf -> -0, +inf -> +0.
inline constexpr FixupByClass kSqrtFixups{Fixup::kInput, Fixup::kInput, Fixup::kPlusZero, Fixup::kKeep,
                                          Fixup::kInput, Fixup::kInput, Fixup::kKeep,     Fixup::kKeep};
inline constexpr FixupByClass kReciprocalFixups{Fixup::kInput,     Fixup::kQuietInput, Fixup::kSignedInf, Fixup::kKeep,
                                                Fixup::kMinusZero, Fixup::kPlusZero,   Fixup::kKeep,      Fixup::kKeep};
// The tables as they were checked against the selects and against division
// (every fp32 input, once).
static_assert(fixup_table(kSqrtFixups) == 0x00110811 && fixup_table(kReciprocalFixups) == 0x00870621);

// sqrt(x) and 1/x for x >= 0 through the FMA ports instead of the divider
// (which both vsqrtps and vdivps share, and which bounds Adam otherwise):
// the hardware estimate (14 bits on AVX-512, 12 on AVX2) refined by one
// Newton-Raphson step, ~22 bits. sqrt(+-0) is +0 and sqrt(inf)/sqrt(nan)
// stay non-finite. Other architectures use the exact instructions.
// AVX-512: vfixupimmps sets the special inputs' results — one instruction
// where selects take four (the same bits as x == 0 ? 0 : isfinite(x) ? s :
// x for all 2^32 inputs, compared once); its estimate is exact enough for
// subnormal x too. AVX2: the estimate of a subnormal's root is inf (the
// instruction treats it as 0), so x < FLT_MIN is taken as 0 — a root of at
// most 1.1e-19, below the estimates' error of the denominators it is added
// to (sqrt(v) / sqrt(bc2) + eps) for the eps the optimizers take it with
// (kernels_impl.h's exact_roots_for); negative x (never a second moment)
// gives 0 there too.
template <class Arch>
xsimd::batch<float, Arch> fast_sqrt(const xsimd::batch<float, Arch>& x) {
  using B = xsimd::batch<float, Arch>;
  if constexpr (has_lane_moves<Arch>()) {
    const B y = rsqrt_estimate<Arch>(x);
    // y <- y * (1.5 - 0.5 x y^2); sqrt(x) = x * y
    B xy = x * y;
    B s = xy * fused_fnma<Arch>(B(0.5f) * xy, y, B(1.5f));
    if constexpr (is_avx512<Arch>()) {
      return fixup<kSqrtFixups>(s, x);
    } else {
      return xsimd::select(x < B(std::numeric_limits<float>::min()), B(0.0f), xsimd::select(xsimd::isfinite(x), s, x));
    }
  } else {
    return xsimd::sqrt(x);
  }
}

// 1/x for the optimizers' denominators (x >= eps > 0, or +inf where v is):
// the Newton step alone turns 1/inf into inf * 0 = NaN, so +inf is fixed up
// to 0 — on AVX-512 by vfixupimmps, which also gives +-0 -> +-inf and
// -inf -> -0 as division does, on AVX2 by clamping x to FLT_MAX first (the
// estimate of its reciprocal is 0; NaN stays NaN).
template <class Arch>
xsimd::batch<float, Arch> fast_reciprocal(const xsimd::batch<float, Arch>& x) {
  using B = xsimd::batch<float, Arch>;
  if constexpr (has_lane_moves<Arch>()) {
    B xc = x;
    if constexpr (!is_avx512<Arch>()) {
      xc = _mm256_min_ps(_mm256_set1_ps(std::numeric_limits<float>::max()), x);  // NaN: x (the second operand)
    }
    const B y = rcp_estimate<Arch>(xc);
    const B r = y * fused_fnma<Arch>(xc, y, B(2.0f));  // y <- y (2 - x y)
    if constexpr (is_avx512<Arch>()) {
      return fixup<kReciprocalFixups>(r, x);
    } else {
      return r;
    }
  } else {
    return B(1.0f) / x;
  }
}

}  // namespace strata::cpu_optim::detail
