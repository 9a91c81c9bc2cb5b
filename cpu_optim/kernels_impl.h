// The vector kernels, written once against xsimd::batch<float, Arch> and
// instantiated per instruction set in kernels_<isa>.cpp (each compiled with
// that ISA's flags); optimizer.cpp picks one at run time.
//
// One optimizer step per batch (BatchStep) serves two drivers: the fused
// path, which loads, converts, updates and stores every stream in registers
// in one pass (AVX-512 and AVX2), and the staged path, which converts a
// sub-tile into zero-padded L1 scratch first — for the final partial vector
// of a span (so tails run the same update code as the bulk) and for
// architectures without lane moves. Every byte of the span's streams is read
// or written from memory exactly once.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <xsimd/xsimd.hpp>

#include "common/check.h"
#include "cpu_optim/kernel_call.h"
#include "cpu_optim/q8.h"
#include "cpu_optim/simd_lanes.h"

namespace strata::cpu_optim::detail {

inline constexpr int64_t kSub = 1024;  // multiple of kQ8BlockElems and of every vector width
static_assert(kSub % kQ8BlockElems == 0);
static_assert(kSub == kGradStatsPartialElems);  // a staged sub-tile is one statistics partial

template <class Arch>
void to_f32(const void* src, DType type, int64_t n, float* __restrict dst) {
  if (type == DType::kF32) {
    std::memcpy(dst, src, static_cast<size_t>(n) * 4);
  } else if (type == DType::kBF16) {
    const auto* s = static_cast<const uint16_t*>(src);
    for (int64_t i = 0; i < n; ++i) dst[i] = std::bit_cast<float>(uint32_t{s[i]} << 16);
  } else if constexpr (has_lane_moves<Arch>()) {
    using B = xsimd::batch<float, Arch>;
    const auto* s = static_cast<const uint16_t*>(src);
    int64_t i = 0;
    for (; i + static_cast<int64_t>(B::size) <= n; i += B::size) load_f16<Arch>(s + i).store_unaligned(dst + i);
    for (; i < n; ++i) dst[i] = f16_to_f32(s[i]);
  } else {
    const auto* s = static_cast<const uint16_t*>(src);
    for (int64_t i = 0; i < n; ++i) dst[i] = f16_to_f32(s[i]);
  }
}

template <class Arch>
void from_f32(const float* __restrict src, DType type, int64_t n, void* dst) {
  if (type == DType::kF32) {
    std::memcpy(dst, src, static_cast<size_t>(n) * 4);
  } else if (type == DType::kBF16) {
    auto* d = static_cast<uint16_t*>(dst);
    for (int64_t i = 0; i < n; ++i) {
      uint32_t u = std::bit_cast<uint32_t>(src[i]);
      uint16_t rounded = static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
      d[i] = (u & 0x7FFFFFFFu) > 0x7F800000u ? static_cast<uint16_t>((u >> 16) | 0x40u) : rounded;
    }
  } else if constexpr (has_lane_moves<Arch>()) {
    using B = xsimd::batch<float, Arch>;
    auto* d = static_cast<uint16_t*>(dst);
    int64_t i = 0;
    for (; i + static_cast<int64_t>(B::size) <= n; i += B::size) store_f16<Arch>(B::load_unaligned(src + i), d + i);
    for (; i < n; ++i) d[i] = f32_to_f16(src[i]);
  } else {
    auto* d = static_cast<uint16_t*>(dst);
    for (int64_t i = 0; i < n; ++i) d[i] = f32_to_f16(src[i]);
  }
}

// 8-bit blockwise states (format in q8.h). The vector code computes exactly
// what q8.h's scalar functions compute, so both give the same codes and
// values. A block shorter than kQ8BlockElems (the end of a span) and
// architectures without lane moves use the scalar functions.

// One batch of codes -> values and values -> codes: q8.h's functions, the
// same operations in the same order, on 32-bit integer lanes. Only the
// byte widening and narrowing need intrinsics (xsimd 8 has neither).
template <class Arch>
using I32 = xsimd::batch<int32_t, Arch>;

// Bytes widened into 32-bit lanes: zero-extended (v codes), or with
// kSigned sign-extended (m codes: bit 31 is then the byte's bit 7).
template <class Arch, bool kSigned = false>
I32<Arch> q8_load_codes(const void* q) {
  if constexpr (is_avx512<Arch>()) {
    const __m128i b = _mm_loadu_si128(static_cast<const __m128i*>(q));
    return kSigned ? _mm512_cvtepi8_epi32(b) : _mm512_cvtepu8_epi32(b);
  } else {
    const __m128i b = _mm_loadl_epi64(static_cast<const __m128i*>(q));
    return kSigned ? _mm256_cvtepi8_epi32(b) : _mm256_cvtepu8_epi32(b);
  }
}
// A batch of codes as values before their block's factor (exact), and
// times it (q8_m_decode / q8_v_decode).
template <class Arch>
xsimd::batch<float, Arch> q8_decode_m_unscaled(const int8_t* q) {
  using B = xsimd::batch<float, Arch>;
  const I32<Arch> c = q8_load_codes<Arch, true>(q);
  // ((c & 0x7F) + offset) << shift, as (c << shift) & (0x7F << shift) |
  // (offset << shift): the offset's bits lie above the code's, so the add
  // is an OR, and and-or is one ternary-logic instruction on AVX-512.
  static_assert(((kQ8MOffset << kQ8MShift) & (0x7F << kQ8MShift)) == 0);
  const B mag =
      xsimd::bitwise_cast<B>(((c << kQ8MShift) & I32<Arch>(0x7F << kQ8MShift)) | I32<Arch>(kQ8MOffset << kQ8MShift)) -
      B(kQ8MZero);
  const I32<Arch> sign = c & I32<Arch>(INT32_MIN);
  return xsimd::bitwise_cast<B>(xsimd::bitwise_cast<I32<Arch>>(mag) | sign);
}
template <class Arch>
xsimd::batch<float, Arch> q8_decode_v_unscaled(const uint8_t* q) {
  using B = xsimd::batch<float, Arch>;
  return xsimd::bitwise_cast<B>((q8_load_codes<Arch>(q) + I32<Arch>(kQ8VOffset)) << kQ8VShift);
}
template <class Arch>
xsimd::batch<float, Arch> q8_decode_m_batch(const int8_t* q, const xsimd::batch<float, Arch>& factor) {
  return q8_decode_m_unscaled<Arch>(q) * factor;
}
template <class Arch>
xsimd::batch<float, Arch> q8_decode_v_batch(const uint8_t* q, const xsimd::batch<float, Arch>& factor) {
  return q8_decode_v_unscaled<Arch>(q) * factor;
}

// The code of t from its fp32 bits (q8_shifted_code): the add rounds half
// up, the shift is arithmetic.
template <class Arch>
I32<Arch> q8_shifted_codes(const xsimd::batch<float, Arch>& t, int32_t add, int shift) {
  return (xsimd::bitwise_cast<I32<Arch>>(t) + I32<Arch>(add)) >> shift;
}
// A batch's m codes (q8_m_encode), 0..255 in 32-bit lanes, from the values
// and their absolute values.
template <class Arch>
I32<Arch> q8_m_codes(const xsimd::batch<float, Arch>& x, const xsimd::batch<float, Arch>& abs_x,
                     const xsimd::batch<float, Arch>& factor) {
  using B = xsimd::batch<float, Arch>;
  const B y = fused_fma<Arch>(abs_x, factor, B(kQ8MZero));
  const I32<Arch> c = xsimd::min(q8_shifted_codes<Arch>(y, kQ8MAdd, kQ8MShift), I32<Arch>(kQ8MMax));
  return c | ((xsimd::bitwise_cast<I32<Arch>>(x) >> 24) & I32<Arch>(0x80));
}
// A batch's v codes (q8_v_encode) before the clamp to 0..255 (any int32:
// below the grid negative, NaN and overflow above 255).
template <class Arch>
I32<Arch> q8_v_codes_unclamped(const xsimd::batch<float, Arch>& x, const xsimd::batch<float, Arch>& factor) {
  static_assert(kQ8VMax == 255, "the saturating narrow clamps to 255");
  return q8_shifted_codes<Arch>(x * factor, kQ8VAdd, kQ8VShift);
}

// AVX2: four batches of 32-bit codes stored as 4 * width bytes, each
// clamped to 0..255: two saturating packs (int32 -> uint16 -> uint8; a
// value that the first leaves above 32767 cannot occur, the shifted codes
// being below 2^12) and one lane permutation put the bytes back in order —
// 4 instructions where a narrowing move per batch costs 2 each (xsimd 8 has
// neither). AVX-512 narrows earlier (q8_codes4_from_bits_avx512).
template <class Arch>
void q8_store_codes4(const I32<Arch>* c, void* q) {
  static_assert(!is_avx512<Arch>());
  const __m256i b = _mm256_packus_epi16(_mm256_packus_epi32(c[0], c[1]), _mm256_packus_epi32(c[2], c[3]));
  _mm256_storeu_si256(static_cast<__m256i*>(q),
                      _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
}

// AVX-512: four batches of codes from their values' fp32 bits, computed in
// 16-bit lanes. The rounding add of q8_shifted_code has no bits below bit
// 16 (kQ8MAdd, kQ8VAdd), so adding it cannot carry out of the low half, and
// the code — the sum shifted right by 19 or 20 — depends on the high half
// alone: the high halves of two batches are gathered into one register (one
// word permutation), added to and shifted there, and two such registers
// narrow to bytes with one saturating pack (kSigned: to -128..127, else
// 0..255) — the same bytes as q8_store_codes4's 32-bit lanes, in 8 vector
// instructions per four batches where it takes 12. The pack interleaves
// the registers' 128-bit lanes, so a qword permutation puts the bytes back
// in element order.
template <class Arch, int32_t kAdd, int kShift, bool kSigned>
__m512i q8_codes4_from_bits_avx512(const __m512i* bits) {
  static_assert(is_avx512<Arch>());
  static_assert((kAdd & 0xFFFF) == 0 && kShift >= 16, "the add and shift must act on the high half alone");
  // Word k < 16 of the gathered register: the high half of lane k of the
  // first batch; k >= 16, of lane k - 16 of the second.
  const __m512i hi =
      _mm512_setr_epi32(0x00030001, 0x00070005, 0x000B0009, 0x000F000D, 0x00130011, 0x00170015, 0x001B0019, 0x001F001D,
                        0x00230021, 0x00270025, 0x002B0029, 0x002F002D, 0x00330031, 0x00370035, 0x003B0039, 0x003F003D);
  const __m512i add = _mm512_set1_epi16(static_cast<int16_t>(kAdd >> 16));
  const __m512i h01 =
      _mm512_srai_epi16(_mm512_add_epi16(_mm512_permutex2var_epi16(bits[0], hi, bits[1]), add), kShift - 16);
  const __m512i h23 =
      _mm512_srai_epi16(_mm512_add_epi16(_mm512_permutex2var_epi16(bits[2], hi, bits[3]), add), kShift - 16);
  const __m512i packed = kSigned ? _mm512_packs_epi16(h01, h23) : _mm512_packus_epi16(h01, h23);
  return _mm512_permutexvar_epi64(_mm512_setr_epi64(0, 2, 4, 6, 1, 3, 5, 7), packed);
}

// AVX-512: four batches of v codes (q8_v_encode) from v and the encoding
// factor.
template <class Arch>
void q8_store_v_codes4_avx512(const float* v, const xsimd::batch<float, Arch>& factor, void* q) {
  using B = xsimd::batch<float, Arch>;
  constexpr int64_t W = B::size;
  static_assert(kQ8VMax == 255, "the saturating pack clamps to 255");
  __m512i bits[4];
  for (int u = 0; u < 4; ++u) bits[u] = _mm512_castps_si512(B::load_unaligned(v + u * W) * factor);
  _mm512_storeu_si512(q, q8_codes4_from_bits_avx512<Arch, kQ8VAdd, kQ8VShift, false>(bits));
}

// AVX-512: four batches of m codes (q8_m_codes) from the magnitudes |m|
// and the signs, a 64-bit mask (bit e set: element e's m has its sign bit
// set, as vpmovd2m gives it). The magnitude's code is >= 0 (y >= 2^-7), so
// the signed saturating pack clamps it to 127 as the min does (NaN
// included), and one masked byte add per four batches sets bit 7 (the
// magnitude being at most 127, adding 0x80 is the OR).
template <class Arch>
void q8_store_m_codes4_avx512(const float* abs_m, uint64_t negative, const xsimd::batch<float, Arch>& factor, void* q) {
  static_assert(is_avx512<Arch>());
  static_assert(kQ8MMax == 127, "the signed saturating pack clamps to 127");
  using B = xsimd::batch<float, Arch>;
  constexpr int64_t W = B::size;
  __m512i bits[4];
  for (int u = 0; u < 4; ++u) {
    bits[u] = _mm512_castps_si512(fused_fma<Arch>(B::load_unaligned(abs_m + u * W), factor, B(kQ8MZero)));
  }
  const __m512i mag = q8_codes4_from_bits_avx512<Arch, kQ8MAdd, kQ8MShift, true>(bits);
  _mm512_storeu_si512(q, _mm512_mask_add_epi8(mag, negative, mag, _mm512_set1_epi8(static_cast<char>(0x80))));
}

// kQ8BlockElems values encoded with the block's encoding factor (a
// multiple of four batches).
template <class Arch>
void q8_encode_block_vec(const float* __restrict src, bool is_v, const xsimd::batch<float, Arch>& factor, void* q) {
  using B = xsimd::batch<float, Arch>;
  constexpr int64_t W = B::size;
  static_assert(kQ8BlockElems % (4 * W) == 0);
  for (int64_t i = 0; i < kQ8BlockElems; i += 4 * W) {
    if constexpr (is_avx512<Arch>()) {
      if (is_v) {
        q8_store_v_codes4_avx512<Arch>(src + i, factor, static_cast<uint8_t*>(q) + i);
      } else {
        alignas(64) float abs_m[4 * W];
        uint64_t negative = 0;
        for (int u = 0; u < 4; ++u) {
          const B x = B::load_unaligned(src + i + u * W);
          xsimd::abs(x).store_aligned(abs_m + u * W);
          negative |= uint64_t{_mm512_movepi32_mask(_mm512_castps_si512(x))} << (u * W);
        }
        q8_store_m_codes4_avx512<Arch>(abs_m, negative, factor, static_cast<uint8_t*>(q) + i);
      }
    } else {
      I32<Arch> c[4];
      for (int u = 0; u < 4; ++u) {
        const B x = B::load_unaligned(src + i + u * W);
        if (is_v) {
          c[u] = q8_v_codes_unclamped<Arch>(x, factor);
        } else {
          c[u] = q8_m_codes<Arch>(x, xsimd::abs(x), factor);
        }
      }
      q8_store_codes4<Arch>(c, static_cast<uint8_t*>(q) + i);
    }
  }
}

template <class Arch>
void q8_decode_block(const void* q, float scale, bool is_v, int64_t len, float* __restrict dst) {
  using B = xsimd::batch<float, Arch>;
  if constexpr (has_lane_moves<Arch>()) {
    if (len == kQ8BlockElems) {
      const B factor(q8_decode_factor(scale, is_v));
      for (int64_t i = 0; i < kQ8BlockElems; i += B::size) {
        B x = is_v ? q8_decode_v_batch<Arch>(static_cast<const uint8_t*>(q) + i, factor)
                   : q8_decode_m_batch<Arch>(static_cast<const int8_t*>(q) + i, factor);
        x.store_unaligned(dst + i);
      }
      return;
    }
  }
  for (int64_t i = 0; i < len; ++i) {
    dst[i] = is_v ? q8_v_decode(static_cast<const uint8_t*>(q)[i], q8_decode_factor(scale, true))
                  : q8_m_decode(static_cast<const int8_t*>(q)[i], q8_decode_factor(scale, false));
  }
}

// The larger of +0 and a batch's largest lane, whose lanes are never NaN
// (the callers' running maxima keep NaN out). Max does not round, so a tree
// of lane moves gives what a scalar loop gives, in a handful of
// instructions instead of one per lane (this runs once per q8 block and
// state, a few percent of the q8 kernel's vector instructions otherwise).
template <class Arch>
float max_lane(const xsimd::batch<float, Arch>& x) {
  float top;
  if constexpr (is_avx512<Arch>()) {
    top = _mm512_reduce_max_ps(x);
  } else if constexpr (has_lane_moves<Arch>()) {
    __m128 t = _mm_max_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    t = _mm_max_ps(t, _mm_movehl_ps(t, t));
    top = _mm_cvtss_f32(_mm_max_ss(t, _mm_movehdup_ps(t)));
  } else {
    alignas(64) float lanes[xsimd::batch<float, Arch>::size];
    x.store_aligned(lanes);
    top = lanes[0];
    for (float l : lanes) top = std::max(top, l);
  }
  return std::max(0.0f, top);  // -0 and all-negative lanes give +0, as before
}

// A block's scale: its largest |m| or v, floored (q8.h). Max is exact, so
// comparison order does not change the result.
template <class Arch>
float q8_block_scale(const float* x, int64_t len, bool is_v) {
  using B = xsimd::batch<float, Arch>;
  constexpr int64_t W = B::size;
  B acc(0.0f);
  int64_t i = 0;
  for (; i + W <= len; i += W) {
    B t = B::load_unaligned(x + i);
    acc = xsimd::max(is_v ? t : xsimd::abs(t), acc);  // NaN lanes keep acc, as std::max does
  }
  float top = max_lane<Arch>(acc);
  for (; i < len; ++i) top = std::max(top, is_v ? x[i] : std::fabs(x[i]));
  return q8_floored_scale(top);
}

// Encodes one block with its scale (q8_block_scale of the same values, which
// a caller may have accumulated while producing them); returns the scale.
template <class Arch>
float q8_encode_block_scaled(const float* __restrict src, bool is_v, int64_t len, void* q, float scale) {
  using B = xsimd::batch<float, Arch>;
  const float factor = q8_encode_factor(scale, is_v);
  if constexpr (has_lane_moves<Arch>()) {
    if (len == kQ8BlockElems) {
      q8_encode_block_vec<Arch>(src, is_v, B(factor), q);
      return scale;
    }
  }
  for (int64_t i = 0; i < len; ++i) {
    if (is_v) {
      static_cast<uint8_t*>(q)[i] = q8_v_encode(src[i], factor);
    } else {
      static_cast<int8_t*>(q)[i] = q8_m_encode(src[i], factor);
    }
  }
  return scale;
}

template <class Arch>
float q8_encode_block(const float* __restrict src, bool is_v, int64_t len, void* q) {
  return q8_encode_block_scaled<Arch>(src, is_v, len, q, q8_block_scale<Arch>(src, len, is_v));
}

// A whole sub-tile of q8 states, block by block.
template <class Arch>
void q8_load(const void* q, const float* scales, bool is_v, int64_t n, float* __restrict dst) {
  for (int64_t b0 = 0; b0 < n; b0 += kQ8BlockElems) {
    q8_decode_block<Arch>(static_cast<const uint8_t*>(q) + b0, scales[b0 / kQ8BlockElems], is_v,
                          std::min(kQ8BlockElems, n - b0), dst + b0);
  }
}

template <class Arch>
void q8_store(const float* __restrict src, bool is_v, int64_t n, void* q, float* scales) {
  for (int64_t b0 = 0; b0 < n; b0 += kQ8BlockElems) {
    scales[b0 / kQ8BlockElems] =
        q8_encode_block<Arch>(src + b0, is_v, std::min(kQ8BlockElems, n - b0), static_cast<uint8_t*>(q) + b0);
  }
}

// Counts inf/nan among the n typed gradient elements, one at a time; only run
// when the vectorised check saw one.
inline int64_t count_nonfinite_scalar(const void* g, DType t, int64_t n) {
  int64_t bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    float x = t == DType::kF32    ? static_cast<const float*>(g)[i]
              : t == DType::kBF16 ? bf16_to_f32(static_cast<const uint16_t*>(g)[i])
                                  : f16_to_f32(static_cast<const uint16_t*>(g)[i]);
    bad += !(std::fabs(x) <= FLT_MAX);
  }
  return bad;
}

// The constants of BatchStep::coarse_step_factor for a call's coefficients:
// k = 1 / (sqrt(bc2) step_size), eps = eps / step_size (lr = 0: k = inf and
// eps = 0, so the factor is 0).
struct CoarseStepConstants {
  float k, eps;
};
inline CoarseStepConstants coarse_step_constants(const TileCall& call) {
  return {1.0f / (call.c.bias_correction2_sqrt * call.c.step_size),
          call.c.step_size != 0.0f ? call.c.eps / call.c.step_size : 0.0f};
}

// Whether Adam's or Adagrad's eps is too small for the estimates. They take
// a v below FLT_MIN (0, or subnormal: a row that gets no gradient decays
// there) as something else — AVX2's root reads it as 0, the coarse factor
// lifts it to FLT_MIN so that its root estimate stays finite — which moves
// the denominator sqrt(v) / sqrt(bc2) + eps by up to sqrt(FLT_MIN) /
// sqrt(bc2) = 2^-63 / sqrt(bc2): under 2^-14 of it (the estimates' own
// error) where eps sqrt(bc2) >= 2^-49 (1.8e-15; at beta2 = 0.999 any eps
// from 5.6e-14 up, torch's default 1e-8 included). Below it, and at eps = 0,
// whose m / 0 a Newton step turns into NaN, the reference's roots and
// divisions (Roots::kExact).
inline constexpr float kEstimatedRootsMinEps = 0x1p-49f;
inline bool exact_roots_for(const Coeffs& c) {
  return c.eps * c.bias_correction2_sqrt < kEstimatedRootsMinEps;
}

// How Adam's and Adagrad's step takes its root and reciprocal:
// - kNewton: the hardware estimates refined by a Newton step (fp32 states);
// - kCoarse: Adam's bare estimates (low-precision states; BatchStep::roots);
// - kExact: the reference's exact roots and divisions, in its order
//   (sqrt(v) / sqrt(bc2) + eps; m over it), for an eps too small for the
//   estimates (exact_roots_for): a zero v gives m / 0 = +-inf and 0 / 0 =
//   NaN at eps = 0, a subnormal one its finite step, as the reference's do.
//   The divider bounds it, and run_tile sends such a tile down the staged
//   path, for a setting that is rare.
enum class Roots : uint8_t { kNewton, kCoarse, kExact };

// One optimizer's update of one batch, in registers: p, m, v in/out, g the
// unscaled gradient. Constants are broadcast once per tile. Non-finite
// gradients are detected without a branch per batch: g * 0 is NaN exactly
// when g is inf or NaN, and a NaN in the running `check` survives.
template <class Arch, OptKind K>
struct BatchStep {
  using B = xsimd::batch<float, Arch>;
  B gs, zero, lr, wd, decay, b1, b2, omb1, omb2, eps, step_size, bc2_sqrt, inv_bc2_sqrt, momentum, one_minus_dampening;
  bool decoupled, nesterov, first_step, has_momentum;
  // Adam over low-precision (bf16, 8-bit) states: the step's factor
  // step_size / (sqrt(v) / sqrt(bc2) + eps) comes from the bare hardware
  // estimates (coarse_step_factor). Their error (~1e-4 relative on AVX-512,
  // ~1e-3 on AVX2) is below what the states themselves carry (bf16: 2^-9
  // relative per rounding, compounded over the steps; 8-bit: ~1e-2), and the
  // Newton steps and their zero / infinity fix-ups cost a quarter of these
  // kernels' vector instructions. k_step = 1 / (sqrt(bc2) step_size) and
  // eps_step = eps / step_size are its constants (step_size folded in).
  // An eps too small for the estimates overrides both (Roots::kExact).
  Roots roots;
  CoarseStepConstants coarse;  // k_step and eps_step as scalars (the 8-bit loop scales them)
  B k_step, eps_step;
  B check;
  // With call.partials: (g * grad_scale)^2 summed per lane, as StatsKernel
  // sums it; the drivers flush it into a partial every kSub elements.
  bool stats;
  B sq;

  explicit BatchStep(const TileCall& call)
      : gs(call.grad_scale),
        zero(0.0f),
        lr(call.c.lr),
        wd(call.c.weight_decay),
        decay(call.c.decay),
        b1(call.c.beta1),
        b2(call.c.beta2),
        omb1(call.c.one_minus_beta1),
        omb2(call.c.one_minus_beta2),
        eps(call.c.eps),
        step_size(call.c.step_size),
        bc2_sqrt(call.c.bias_correction2_sqrt),
        inv_bc2_sqrt(1.0f / call.c.bias_correction2_sqrt),
        momentum(call.c.momentum),
        one_minus_dampening(call.c.one_minus_dampening),
        decoupled(call.c.decoupled),
        nesterov(call.c.nesterov),
        first_step(call.c.first_step),
        has_momentum(call.c.momentum != 0.0f),
        roots((K == OptKind::kAdam || K == OptKind::kAdagrad) && exact_roots_for(call.c) ? Roots::kExact
              : call.state_type != StateType::kF32                                       ? Roots::kCoarse
                                                                                         : Roots::kNewton),
        coarse(coarse_step_constants(call)),
        k_step(coarse.k),
        eps_step(coarse.eps),
        check(0.0f),
        stats(call.partials != nullptr),
        sq(0.0f) {}

  // The update with Adam's two choices (the decay, the roots) fixed at
  // compile time (the fused loops are instantiated per choice: a branch per
  // batch costs issue slots the vector instructions need); operator()
  // picks them at run time.
  // kCheck = false leaves the inf/nan check to the caller (run_fused, which
  // takes it from the class test of a streamed bf16 copy:
  // store_bf16_pair_checked).
  template <bool kDecoupled, Roots kRoots, bool kCheck = true>
  void step(B& p, B graw, B& m, B& v) {
    if constexpr (kCheck) check = fused_fma<Arch>(graw, zero, check);
    B g = graw * gs;
    if constexpr (K == OptKind::kAdam) {
      if constexpr (!kDecoupled) g = fused_fma<Arch>(wd, p, g);
      m = fused_fma<Arch>(b1, m, omb1 * g);
      v = fused_fma<Arch>(b2, v, omb2 * g * g);
      if constexpr (kDecoupled) p = p * decay;
      if constexpr (kRoots == Roots::kExact) {
        p = fused_fnma<Arch>(step_size, m / (xsimd::sqrt(v) / bc2_sqrt + eps), p);
      } else if constexpr (kRoots == Roots::kCoarse && has_lane_moves<Arch>()) {
        p = fused_fnma<Arch>(m, coarse_step_factor(v, k_step, eps_step), p);
      } else if constexpr (kRoots == Roots::kCoarse) {
        const B denom = fused_fma<Arch>(coarse_sqrt<Arch>(v), inv_bc2_sqrt, eps);
        p = fused_fnma<Arch>(step_size, m * coarse_reciprocal<Arch>(denom), p);
      } else {
        const B denom = fused_fma<Arch>(fast_sqrt<Arch>(v), inv_bc2_sqrt, eps);
        p = fused_fnma<Arch>(step_size, m * fast_reciprocal<Arch>(denom), p);
      }
    } else if constexpr (K == OptKind::kAdagrad) {
      g = fused_fma<Arch>(wd, p, g);
      v = fused_fma<Arch>(g, g, v);
      if constexpr (kRoots == Roots::kExact) {
        p = fused_fnma<Arch>(step_size, g / (xsimd::sqrt(v) + eps), p);
      } else {
        p = fused_fnma<Arch>(step_size, g * fast_reciprocal<Arch>(fast_sqrt<Arch>(v) + eps), p);
      }
    } else if constexpr (K == OptKind::kLion) {
      B u = fused_fma<Arch>(b1, m, omb1 * g);
      B sign = xsimd::select(u > zero, B(1.0f), xsimd::select(u < zero, B(-1.0f), zero));
      p = fused_fnma<Arch>(lr, sign, p * decay);
      m = fused_fma<Arch>(b2, m, omb2 * g);
    } else {
      g = fused_fma<Arch>(wd, p, g);
      if (has_momentum) {
        m = first_step ? g : fused_fma<Arch>(momentum, m, one_minus_dampening * g);
        g = nesterov ? fused_fma<Arch>(momentum, m, g) : m;
      }
      p = fused_fnma<Arch>(lr, g, p);
    }
  }

  // AdamW over 8-bit states in run_fused's q8 loop, on scaled moments:
  // m' = m / c1 and v' = v / c2 with c1 = (1 - beta1) scale and
  // c2 = (1 - beta2) scale^2 (q8_scaled_moments), so the gradient's terms are
  // the raw g and g * g — m' = b1s m'_code + g and v' = b2s v'_code + g g,
  // where b1s and b2s carry beta, the block's decode factor and 1 / c — and
  // the step m * step_factor(v) is m' * step_factor'(v') with c1 and
  // sqrt(c2) in its constants (k_s, eps_s): three multiplications per batch
  // fewer than step() (decode twice, scale once, the terms' coefficients
  // twice). The codes of m' and v' are those of m and v (a block's codes are
  // relative to its largest value) up to the last bit of the products. v' is
  // never 0 (b2s >= kQ8MinB2s, and a decoded v' is at least its code 0's
  // 1.125 * 2^-32), so its root needs no lift (coarse_step_factor).
  // (g * g overflows for |g| above 1.8e19, where the scaled square of
  // step() might not; a raw gradient that size is not a training gradient.)
  template <bool kCheck = true>
  void adamw_q8_scaled(B& p, B graw, B& m, B& v, const B& b1s, const B& b2s, const B& k_s, const B& eps_s) {
    static_assert(K == OptKind::kAdam);
    if constexpr (kCheck) check = fused_fma<Arch>(graw, zero, check);
    m = fused_fma<Arch>(b1s, m, graw);
    v = fused_fma<Arch>(b2s, v, graw * graw);
    p = fused_fnma<Arch>(m, coarse_step_factor<true>(v, k_s, eps_s), p * decay);
  }

  // step_size / (sqrt(v) / sqrt(bc2) + eps) from two estimates: with
  // r = 1/sqrt(v) it is r / (k_step + eps_step r) (numerator and denominator
  // times r / step_size), one square root and one reciprocal estimate where
  // sqrt(v) = 1/rsqrt(v) would take a third. v = 0 is lifted to the
  // smallest normal number, so r stays finite and the factor is the
  // 1 / eps_step it should be (to the estimates' error for the eps taken
  // here: exact_roots_for); v = inf gives r = 0 and a factor of 0, as
  // the exact formula (a non-finite m then makes the update NaN).
  // kPositive: the caller's v is never 0 (adamw_q8_scaled's), no lift.
  template <bool kPositive = false>
  static B coarse_step_factor(const B& v, const B& k, const B& eps_k) {
    const B r = rsqrt_estimate<Arch>(kPositive ? v : xsimd::max(v, B(std::numeric_limits<float>::min())));
    return r * rcp_estimate<Arch>(fused_fma<Arch>(eps_k, r, k));
  }

  // The sum of squares' term of one batch (the same product step() takes).
  void add_square(const B& graw) {
    const B g = graw * gs;
    sq = fused_fma<Arch>(g, g, sq);
  }
  // Flushes the running sum into partial `k` (StatsKernel's reduction).
  void flush_square(double* partials, int64_t k) {
    partials[k] = static_cast<double>(xsimd::hadd(sq));
    sq = zero;
  }
  // A fused loop's batch at element i: its term, and the flush when the
  // batch ends a partial.
  void add_square_at(const B& graw, double* partials, int64_t i) {
    add_square(graw);
    if ((i + static_cast<int64_t>(B::size)) % kSub == 0) flush_square(partials, i / kSub);
  }

  void operator()(B& p, B graw, B& m, B& v) {
    if (stats) add_square(graw);
    decoupled ? step_with_roots<true>(p, graw, m, v) : step_with_roots<false>(p, graw, m, v);
  }
  template <bool kDecoupled>
  void step_with_roots(B& p, B graw, B& m, B& v) {
    switch (roots) {
      case Roots::kNewton:
        return step<kDecoupled, Roots::kNewton>(p, graw, m, v);
      case Roots::kCoarse:
        return step<kDecoupled, Roots::kCoarse>(p, graw, m, v);
      case Roots::kExact:
        return step<kDecoupled, Roots::kExact>(p, graw, m, v);
    }
  }

  bool saw_nonfinite() const { return !xsimd::all(xsimd::isfinite(check)); }
};

// The staged update over zero-padded fp32 scratch of n elements (a multiple
// of the width): used for a span's last partial vector and on architectures
// without lane moves.
template <class Arch, OptKind K>
void update_scratch(BatchStep<Arch, K>& st, float* p, const float* g, float* m, float* v, int64_t n, bool has_m,
                    bool has_v) {
  using B = xsimd::batch<float, Arch>;
  for (int64_t i = 0; i < n; i += B::size) {
    B pp = B::load_aligned(p + i), mm = has_m ? B::load_aligned(m + i) : B(0.0f);
    B vv = has_v ? B::load_aligned(v + i) : B(0.0f);
    st(pp, B::load_aligned(g + i), mm, vv);
    pp.store_aligned(p + i);
    if (has_m) mm.store_aligned(m + i);
    if (has_v) vv.store_aligned(v + i);
  }
}

template <class Arch>
void load_state(const TileCall& call, bool is_v, int64_t off, int64_t len, float* dst) {
  void* base = is_v ? call.v : call.m;
  switch (call.state_type) {
    case StateType::kF32: to_f32<Arch>(static_cast<float*>(base) + off, DType::kF32, len, dst); break;
    case StateType::kBF16: to_f32<Arch>(static_cast<uint16_t*>(base) + off, DType::kBF16, len, dst); break;
    case StateType::kQ8:
      q8_load<Arch>(static_cast<uint8_t*>(base) + off, (is_v ? call.v_scale : call.m_scale) + off / kQ8BlockElems, is_v,
              len, dst);
      break;
  }
}

template <class Arch>
void store_state(const TileCall& call, bool is_v, int64_t off, int64_t len, const float* src) {
  void* base = is_v ? call.v_next : call.m_next;
  switch (call.state_type) {
    case StateType::kF32: from_f32<Arch>(src, DType::kF32, len, static_cast<float*>(base) + off); break;
    case StateType::kBF16: from_f32<Arch>(src, DType::kBF16, len, static_cast<uint16_t*>(base) + off); break;
    case StateType::kQ8:
      q8_store<Arch>(src, is_v, len, static_cast<uint8_t*>(base) + off,
                     (is_v ? call.v_scale_next : call.m_scale_next) + off / kQ8BlockElems);
      break;
  }
}

// Staged path: each kSub sub-tile converted into L1 scratch, updated, and
// converted back. Handles any length and every state type.
// `base`: the elements of the tile before `call` (the fused prefix), which
// place its sum-of-squares partials.
template <class Arch, OptKind K>
void run_staged(const TileCall& call, BatchStep<Arch, K>& st, int64_t base) {
  constexpr int64_t W = xsimd::batch<float, Arch>::size;
  alignas(64) float sp[kSub], sg[kSub], sm[kSub], sv[kSub];
  const bool has_m = uses_m(call.kind, call.c), has_v = uses_v(call.kind);
  const uint64_t gbytes = dtype_bytes(call.grad_dtype);
  for (int64_t off = 0; off < call.n; off += kSub) {
    const int64_t len = std::min(kSub, call.n - off);
    const int64_t padded = (len + W - 1) / W * W;
    const size_t pad_bytes = static_cast<size_t>(padded - len) * 4;
    std::memcpy(sp, call.params + off, static_cast<size_t>(len) * 4);
    std::memset(sp + len, 0, pad_bytes);
    to_f32<Arch>(static_cast<const std::byte*>(call.grad) + off * gbytes, call.grad_dtype, len, sg);
    std::memset(sg + len, 0, pad_bytes);
    if (has_m) {
      load_state<Arch>(call, false, off, len, sm);
      std::memset(sm + len, 0, pad_bytes);
    }
    if (has_v) {
      load_state<Arch>(call, true, off, len, sv);
      std::memset(sv + len, 0, pad_bytes);
    }
    update_scratch<Arch, K>(st, sp, sg, sm, sv, padded, has_m, has_v);
    if (st.stats) {
      // A staged sub-tile lies within one partial: from the tile's start
      // (SSE2) it is one, and after a fused prefix it is the span's last
      // partial vector or q8 block.
      const int64_t first = base + off, end = base + off + len;
      STRATA_CHECK_MSG(first / kSub == (end - 1) / kSub, "a staged sub-tile straddles two gradient partials");
      if (end % kSub == 0 || off + len == call.n) st.flush_square(call.partials, first / kSub);
    }
    std::memcpy(call.params_next + off, sp, static_cast<size_t>(len) * 4);
    if (has_m) store_state<Arch>(call, false, off, len, sm);
    if (has_v) store_state<Arch>(call, true, off, len, sv);
    if (call.out != nullptr) {
      from_f32<Arch>(sp, call.out_dtype, len, static_cast<std::byte*>(call.out) + off * dtype_bytes(call.out_dtype));
    }
  }
}

// Fused path: every stream is loaded, converted, updated and stored in
// registers, one batch at a time, in a single pass. The stream types are
// template parameters (G: gradient, S: state, O: output copy, kNone for no
// copy), so the loop has no per-batch branches. q8 states go through a
// one-block (256-element) scratch, because a block's new scale needs all its
// new values before any can be encoded. n must be a multiple of the width
// (and of kQ8BlockElems for q8 states).
enum class OutKind : uint8_t { kNone, kBF16, kF16 };

// Prefetches element i + kAhead (kPrefetchElems unless the loop has its
// own) of a stream whose elements are `Bytes` wide. The bf16-state loop
// calls it once per batch (a repeated prefetch of a line is cheap), the
// 8-bit loop once per line; the fp32-state loop not at all (run_fused).
// 256 ahead: with fp32 states left to the hardware prefetcher, the
// bf16-state loop ran at 0.99-1.12 of its roofline at two threads where it
// ran at 0.86-0.99 with 512 (eight alternating pairs; bench/results/cpu_optim_revisions.md,
// "Eleventh revision").
inline constexpr int64_t kPrefetchElems = 256;
template <int64_t Bytes, int64_t kAhead = kPrefetchElems>
inline void prefetch_ahead(const void* base, int64_t i) {
  _mm_prefetch(static_cast<const char*>(base) + (i + kAhead) * Bytes, _MM_HINT_T0);
}

// The low-precision copy of the new weights, element i.. of `out`:
// non-temporal when `stream` (the caller checked the alignment) — nothing
// reads it back during the update, and streaming spares the read for
// ownership of every line (2 of the offload mode's 28 bytes per parameter).
template <class Arch, OutKind O>
[[gnu::always_inline]] inline void store_out(void* out, int64_t i, const xsimd::batch<float, Arch>& p, bool stream,
                                             bool native_bf16) {
  if constexpr (O == OutKind::kNone) {
    return;  // `out` may be null: no pointer is formed from it
  } else if constexpr (has_lane_moves<Arch>()) {
    if (stream) {
      auto* dst = static_cast<uint16_t*>(out) + i;
      if constexpr (O == OutKind::kBF16) store_bf16<Arch, true>(p, dst, native_bf16);
      if constexpr (O == OutKind::kF16) store_f16<Arch, true>(p, dst);
      return;
    }
  }
  store_from_f32<Arch>(out, O == OutKind::kF16 ? DType::kF16 : DType::kBF16, i, p, native_bf16);
}

// Whether a tile's `out` may be streamed: a lane-move ISA and `out` aligned
// to two batches of 2-byte lanes (the AVX-512 loops stream pairs of batches).
template <class Arch, OutKind O>
bool can_stream_out(const void* out) {
  constexpr uintptr_t kBytes = xsimd::batch<float, Arch>::size * 4;
  return O != OutKind::kNone && has_lane_moves<Arch>() && reinterpret_cast<uintptr_t>(out) % kBytes == 0;
}

// Two batches as bf16 by one vcvtne2ps2bf16, which flushes subnormals: a
// pair with a lane in one of the classes kSpecial tests (vfpclassps bits;
// at least subnormals) takes the integer rounding instead, as store_bf16
// does, after on_special(). kStream: non-temporal, dst 64-byte aligned.
inline constexpr int kClassSubnormal = 0x20;
template <class Arch, bool kStream, int kSpecial = kClassSubnormal, class OnSpecial>
[[gnu::always_inline]] inline void store_bf16_pair(const xsimd::batch<float, Arch>& a,
                                                   const xsimd::batch<float, Arch>& b, uint16_t* dst,
                                                   OnSpecial&& on_special) {
  static_assert(is_avx512<Arch>() && (kSpecial & kClassSubnormal) != 0);
  if (_kortestz_mask16_u8(_mm512_fpclass_ps_mask(a, kSpecial), _mm512_fpclass_ps_mask(b, kSpecial))) {
    const auto both = reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(b, a));
    if constexpr (kStream) {
      _mm512_stream_si512(reinterpret_cast<__m512i*>(dst), both);
    } else {
      _mm512_storeu_si512(dst, both);
    }
    return;
  }
  on_special();
  store_bf16<Arch, kStream>(a, dst, false);
  store_bf16<Arch, kStream>(b, dst + xsimd::batch<float, Arch>::size, false);
}
template <class Arch, bool kStream>
[[gnu::always_inline]] inline void store_bf16_pair(const xsimd::batch<float, Arch>& a,
                                                   const xsimd::batch<float, Arch>& b, uint16_t* dst) {
  store_bf16_pair<Arch, kStream>(a, b, dst, [] {});
}

// Two batches of new weights streamed as bf16, with the inf/nan check of
// their gradients: run_fused's Adam loops, where the new weights are NaN
// wherever a gradient is not finite. Only a pair with a subnormal, infinite
// or NaN weight folds its gradients into the check (and takes the integer
// rounding).
template <class Arch, OptKind K>
[[gnu::always_inline]] inline void store_bf16_pair_checked(const xsimd::batch<float, Arch>& a,
                                                           const xsimd::batch<float, Arch>& b,
                                                           const xsimd::batch<float, Arch>& ga,
                                                           const xsimd::batch<float, Arch>& gb, uint16_t* dst,
                                                           BatchStep<Arch, K>& st) {
  constexpr int kSpecial = 0x01 | 0x08 | 0x10 | kClassSubnormal | 0x80;  // QNaN, +inf, -inf, subnormal, SNaN
  store_bf16_pair<Arch, true, kSpecial>(a, b, dst, [&] {
    st.check = fused_fma<Arch>(ga, st.zero, st.check);
    st.check = fused_fma<Arch>(gb, st.zero, st.check);
  });
}

// What a fused loop fixes at compile time besides its stream types: AdamW's
// decoupled decay, bf16 rounding with vcvtneps2bf16 (TileKernel), a
// streamed `out` (can_stream_out), and the gradient statistics.
struct FusedFlags {
  bool decoupled = false, native_bf16 = false, stream_out = false;
  bool stats = false;  // the gradient's sum-of-squares partials too (TileCall::partials)
};

// The least b2s of adamw_q8_scaled: with it a decoded v' (>= 1.125 * 2^-32)
// times b2s is a normal number, so the new v' is positive even in a block
// whose v was all zero (scale 0); the 2^-126 or so it adds to v' there is
// far below any square of a gradient the codes can hold.
inline constexpr float kQ8MinB2s = 0x1p-94f;

// The scales of AdamW's 8-bit loop (BatchStep::adamw_q8_scaled): m and v
// are held divided by c1 = (1 - beta1) scale and c2 = (1 - beta2) scale^2.
// `usable` when both are normal numbers (a zero gradient scale, say, is
// not): otherwise the staged path updates the tile.
struct Q8ScaledMoments {
  float c1 = 1.0f, c2 = 1.0f;
  bool usable = false;
};
inline Q8ScaledMoments q8_scaled_moments(const TileCall& call) {
  Q8ScaledMoments sm;
  sm.c1 = call.c.one_minus_beta1 * call.grad_scale;
  sm.c2 = call.c.one_minus_beta2 * call.grad_scale * call.grad_scale;
  sm.usable = std::isnormal(sm.c1) && std::isnormal(sm.c2) && sm.c1 > 0.0f && sm.c2 > 0.0f;
  return sm;
}

// The q8 loop's prefetch distance (its parameters per batch take longer):
// 1024 ahead ran 3-10% faster from memory than 2048 or 512 on a host with
// 60-70 GB/s of triad (bench/results/cpu_optim_revisions.md, "Eighth revision"), and no slower
// than 2048 on the earlier, slower one.
inline constexpr int64_t kQ8PrefetchElems = 1024;

// One tile of the fused update over its n elements, the two state layouts
// (fp32/bf16 streams, 8-bit blocks) as two branches of one body. Long by
// design: the hot loops keep every pointer and constant in locals of one
// frame (see below) so that the compiler holds them in registers; split
// into calls, each would reload them through memory per batch.
template <class Arch, OptKind K, DType G, StateType S, OutKind O, FusedFlags F>
void run_fused(const TileCall& call, BatchStep<Arch, K>& step_state, int64_t n) {
  using B = xsimd::batch<float, Arch>;
  constexpr int64_t W = B::size;
  constexpr bool kHasV = K == OptKind::kAdam || K == OptKind::kAdagrad;
  // Locals, not references: stores through the float pointers below could
  // alias a referenced object, which would force the constants and the
  // running check back to memory on every batch.
  BatchStep<Arch, K> st = step_state;
  const float* const params = call.params;
  float* const params_next = call.params_next;
  const void* const grad = call.grad;
  const void* const mem_m = call.m;
  const void* const mem_v = call.v;
  void* const mem_m_next = call.m_next;
  void* const mem_v_next = call.v_next;
  void* const out = call.out;
  double* const partials = call.partials;
  const bool has_m = K == OptKind::kAdam || K == OptKind::kLion || uses_m(K, call.c);
  constexpr bool stream_out = F.stream_out, native_bf16 = F.native_bf16;
  if constexpr (K != OptKind::kAdam && S != StateType::kF32) {
    STRATA_CHECK_MSG(false, "low-precision states reached a non-Adam kernel");
  } else if constexpr (S != StateType::kQ8) {
    constexpr DType kState = S == StateType::kF32 ? DType::kF32 : DType::kBF16;
    constexpr int64_t kSB = kState == DType::kF32 ? 4 : 2;
    // With vcvtneps2bf16 (native_bf16, AVX-512) the bf16 streams are
    // rounded two batches per vcvtne2ps2bf16; for Adam with a streamed bf16
    // copy the inf/nan check also rides on that copy's class test
    // (store_bf16_pair_checked: Adam's new weight is NaN wherever the
    // gradient is not finite — not so for Lion, whose sign() drops a NaN).
    constexpr bool kPairs = is_avx512<Arch>() && native_bf16;
    constexpr bool kPairCheck = kPairs && K == OptKind::kAdam && O == OutKind::kBF16 && stream_out;
    // Software prefetch a few KiB ahead over bf16 states only. Their loop
    // does more arithmetic per byte, and with its instructions in flight
    // the out-of-order window alone keeps too few lines requested. Over
    // fp32 states the hardware prefetcher seems to keep ahead of the loop
    // by itself, and software prefetches into L1 only to take miss slots
    // from its loads: without them the fp32 mode went from 0.69-0.96 of
    // its roofline to 0.99-1.08, offload from 0.84-1.00 to 0.94-1.05
    // (bench/results/cpu_optim_revisions.md, "Tenth revision"), while bf16 states lose
    // without it.
    constexpr bool kPrefetch = kState != DType::kF32;
    // One batch at i: loaded, updated, the new fp32 weights stored.
    auto one = [&]<bool kCheck>(std::bool_constant<kCheck>, int64_t i, B& p, B& m, B& v, B& graw) {
      if constexpr (kPrefetch) {
        prefetch_ahead<4>(params, i);
        prefetch_ahead<G == DType::kF32 ? 4 : 2>(grad, i);
        if (has_m) prefetch_ahead<kSB>(mem_m, i);
        if constexpr (kHasV) prefetch_ahead<kSB>(mem_v, i);
        if (O != OutKind::kNone && !stream_out) prefetch_ahead<2>(out, i);  // a streamed out is never read
      }
      p = B::load_unaligned(params + i);
      m = has_m ? load_as_f32<Arch>(mem_m, kState, i) : B(0.0f);
      v = kHasV ? load_as_f32<Arch>(mem_v, kState, i) : B(0.0f);
      graw = load_as_f32<Arch>(grad, G, i);
      if constexpr (F.stats) st.add_square_at(graw, partials, i);
      st.template step<F.decoupled, S != StateType::kF32 ? Roots::kCoarse : Roots::kNewton, kCheck>(p, graw, m, v);
      p.store_unaligned(params_next + i);
    };
    int64_t i = 0;
    if constexpr (kPairs) {
      for (; i + 2 * W <= n; i += 2 * W) {
        B pa, ma, va, ga, pb, mb, vb, gb;
        one(std::bool_constant<!kPairCheck>{}, i, pa, ma, va, ga);
        one(std::bool_constant<!kPairCheck>{}, i + W, pb, mb, vb, gb);
        if constexpr (kState == DType::kBF16) {
          if (has_m) store_bf16_pair<Arch, false>(ma, mb, static_cast<uint16_t*>(mem_m_next) + i);
          if constexpr (kHasV) store_bf16_pair<Arch, false>(va, vb, static_cast<uint16_t*>(mem_v_next) + i);
        } else {
          if (has_m) {
            ma.store_unaligned(static_cast<float*>(mem_m_next) + i);
            mb.store_unaligned(static_cast<float*>(mem_m_next) + i + W);
          }
          if constexpr (kHasV) {
            va.store_unaligned(static_cast<float*>(mem_v_next) + i);
            vb.store_unaligned(static_cast<float*>(mem_v_next) + i + W);
          }
        }
        if constexpr (kPairCheck) {
          store_bf16_pair_checked(pa, pb, ga, gb, static_cast<uint16_t*>(out) + i, st);
        } else if constexpr (O == OutKind::kBF16) {
          store_bf16_pair<Arch, stream_out>(pa, pb, static_cast<uint16_t*>(out) + i);
        } else {
          store_out<Arch, O>(out, i, pa, stream_out, native_bf16);
          store_out<Arch, O>(out, i + W, pb, stream_out, native_bf16);
        }
      }
    }
    for (; i < n; i += W) {
      B p, m, v, graw;
      one(std::true_type{}, i, p, m, v, graw);
      if (has_m) store_from_f32<Arch>(mem_m_next, kState, i, m, native_bf16);
      if constexpr (kHasV) store_from_f32<Arch>(mem_v_next, kState, i, v, native_bf16);
      store_out<Arch, O>(out, i, p, stream_out, native_bf16);
    }
  } else {
    // Per block: decode, update and keep the new m and v in scratch while
    // their new scales are gathered; a block's codes can only be written
    // once all its new values are known. The encoding of block b - 1 is
    // interleaved with the update of block b, four batches of each at a
    // time (two scratch blocks, alternating): a separate encoding loop per
    // block would leave the memory streams idle while it ran. (AdamW runs on
    // scaled moments: BatchStep::adamw_q8_scaled.) m goes to scratch as |m|,
    // which the scale and the encoding need, and (AVX-512) its signs as a
    // mask per batch (q8_store_m_codes4_avx512).
    //
    // With a streamed bf16 copy rounded by vcvtneps2bf16 (kPairOut), two
    // batches are rounded by one instruction, and the inf/nan check rides
    // on the class test that instruction needs anyway (it flushes
    // subnormals, so subnormal lanes take the integer rounding): Adam's new
    // weight is NaN wherever the gradient is inf or NaN (m is then
    // non-finite and its factor 0 or non-finite), so a pair whose new
    // weights are all finite and normal has finite gradients, and only the
    // pairs that fail the test fold their gradients into the check — the
    // same result as checking every batch.
    constexpr bool kAvx512 = is_avx512<Arch>();
    constexpr bool kPairOut = kAvx512 && O == OutKind::kBF16 && native_bf16 && stream_out;
    alignas(64) float bam[2][kQ8BlockElems], bv[2][kQ8BlockElems];
    alignas(64) float bm[2][kAvx512 ? 1 : kQ8BlockElems];          // AVX2: m itself
    alignas(8) uint16_t bneg[2][kAvx512 ? kQ8BlockElems / W : 1];  // AVX-512: m's sign bits, a mask per batch
    const auto* const qm = static_cast<const int8_t*>(mem_m);
    const auto* const qv = static_cast<const uint8_t*>(mem_v);
    auto* const qm_next = static_cast<int8_t*>(mem_m_next);
    auto* const qv_next = static_cast<uint8_t*>(mem_v_next);
    constexpr bool kFold = F.decoupled;
    // AdamW: the moments scaled by c1, c2 (BatchStep::adamw_q8_scaled).
    const Q8ScaledMoments sm = q8_scaled_moments(call);
    const B k_s(st.coarse.k * std::sqrt(sm.c2) / sm.c1), eps_s(st.coarse.eps / sm.c1);
    // The block scales' floors (q8_floored_scale): scaled moments are
    // floored where their scaled-back scale would be floored, and at the
    // smallest normal number themselves (their encoding factor's).
    const float m_floor = kFold ? std::max(kQ8MinScale, kQ8MinScale / sm.c1) : kQ8MinScale;
    const float v_floor = kFold ? std::max(kQ8MinScale, kQ8MinScale / sm.c2) : kQ8MinScale;
    static_assert(kQ8BlockElems % (4 * W) == 0);
    // Four batches of block `blk`'s codes, from scratch `s` at j.
    auto encode4 = [&](int s, int64_t blk, int64_t j, const B& m_enc, const B& v_enc) {
      const int64_t at = blk * kQ8BlockElems + j;
      if constexpr (kAvx512) {
        q8_store_v_codes4_avx512<Arch>(bv[s] + j, v_enc, qv_next + at);
        uint64_t negative;
        std::memcpy(&negative, &bneg[s][j / W], sizeof negative);
        q8_store_m_codes4_avx512<Arch>(bam[s] + j, negative, m_enc, qm_next + at);
      } else {
        I32<Arch> c[4];
        for (int u = 0; u < 4; ++u) c[u] = q8_v_codes_unclamped<Arch>(B::load_aligned(bv[s] + j + u * W), v_enc);
        q8_store_codes4<Arch>(c, qv_next + at);
        for (int u = 0; u < 4; ++u) {
          c[u] = q8_m_codes<Arch>(B::load_aligned(bm[s] + j + u * W), B::load_aligned(bam[s] + j + u * W), m_enc);
        }
        q8_store_codes4<Arch>(c, qm_next + at);
      }
    };
    B prev_m_enc(0.0f), prev_v_enc(0.0f);  // the previous block's encoding factors
    const int64_t blocks = n / kQ8BlockElems;
    for (int64_t blk = 0; blk < blocks; ++blk) {
      const int64_t b0 = blk * kQ8BlockElems;
      const int s = static_cast<int>(blk & 1);
      const float m_factor = q8_decode_factor(call.m_scale[blk], false);
      const float v_factor = q8_decode_factor(call.v_scale[blk], true);
      const B m_dec(m_factor), v_dec(v_factor);
      const B b1s(call.c.beta1 * m_factor / sm.c1), b2s(std::max(call.c.beta2 * v_factor / sm.c2, kQ8MinB2s));
      B top_m(0.0f), top_v(0.0f);  // the new block scales, gathered on the way
      // One batch at j: its new weights (returned; stored here but for the
      // bf16 copy) and its new m, |m| and v into scratch.
      auto batch = [&](int64_t j, B& graw) -> B {
        const int64_t i = b0 + j;
        // Each stream's line once (its narrow streams cross a line every
        // two or four batches), further ahead than the other loops.
        prefetch_ahead<4, kQ8PrefetchElems>(params, i);
        if (G == DType::kF32 || j % (2 * W) == 0) prefetch_ahead<G == DType::kF32 ? 4 : 2, kQ8PrefetchElems>(grad, i);
        if (j % (4 * W) == 0) {
          prefetch_ahead<1, kQ8PrefetchElems>(qm, i);
          prefetch_ahead<1, kQ8PrefetchElems>(qv, i);
        }
        if (O != OutKind::kNone && !stream_out) prefetch_ahead<2, kQ8PrefetchElems>(out, i);
        B p = B::load_unaligned(params + i);
        B m, v;
        graw = load_as_f32<Arch>(grad, G, i);
        if constexpr (F.stats) st.add_square_at(graw, partials, i);
        if constexpr (kFold) {
          m = q8_decode_m_unscaled<Arch>(qm + i);
          v = q8_decode_v_unscaled<Arch>(qv + i);
          st.template adamw_q8_scaled<!kPairOut>(p, graw, m, v, b1s, b2s, k_s, eps_s);
        } else {
          m = q8_decode_m_batch<Arch>(qm + i, m_dec);
          v = q8_decode_v_batch<Arch>(qv + i, v_dec);
          st.template step<F.decoupled, Roots::kCoarse, !kPairOut>(p, graw, m, v);
        }
        p.store_unaligned(params_next + i);
        const B am = xsimd::abs(m);
        if constexpr (kAvx512) {
          bneg[s][j / W] = _mm512_movepi32_mask(_mm512_castps_si512(m));
        } else {
          m.store_aligned(bm[s] + j);
        }
        am.store_aligned(bam[s] + j);
        v.store_aligned(bv[s] + j);
        top_m = xsimd::max(am, top_m);  // as q8_block_scale: NaN lanes keep the max
        top_v = xsimd::max(v, top_v);
        return p;
      };
      for (int64_t j0 = 0; j0 < kQ8BlockElems; j0 += 4 * W) {
        for (int64_t j = j0; j < j0 + 4 * W; j += 2 * W) {
          B ga, gb;
          const B pa = batch(j, ga);
          const B pb = batch(j + W, gb);
          if constexpr (kPairOut) {
            store_bf16_pair_checked(pa, pb, ga, gb, static_cast<uint16_t*>(out) + b0 + j, st);
          } else {
            store_out<Arch, O>(out, b0 + j, pa, stream_out, native_bf16);
            store_out<Arch, O>(out, b0 + j + W, pb, stream_out, native_bf16);
          }
        }
        if (blk > 0) encode4(s ^ 1, blk - 1, j0, prev_m_enc, prev_v_enc);
      }
      // The block's largest |m| and v, floored (scaled back when scaled,
      // exactly so for the encoding factors, which apply to the values as
      // they are).
      const float top_m_lane = q8_floored_scale(max_lane<Arch>(top_m), m_floor);
      const float top_v_lane = q8_floored_scale(max_lane<Arch>(top_v), v_floor);
      call.m_scale_next[blk] = kFold ? top_m_lane * sm.c1 : top_m_lane;
      call.v_scale_next[blk] = kFold ? top_v_lane * sm.c2 : top_v_lane;
      prev_m_enc = B(q8_encode_factor(top_m_lane, false));
      prev_v_enc = B(q8_encode_factor(top_v_lane, true));
    }
    if (blocks > 0) {
      for (int64_t j0 = 0; j0 < kQ8BlockElems; j0 += 4 * W) {
        encode4(static_cast<int>((blocks - 1) & 1), blocks - 1, j0, prev_m_enc, prev_v_enc);
      }
    }
  }
  if constexpr (stream_out) _mm_sfence();  // the streamed lines reach memory before the tile is reported done
  step_state.check = st.check;
  step_state.sq = st.sq;  // a partial the staged tail continues
}

// f(std::true_type) when `on`, else f(std::false_type); only the latter
// is instantiated where the flag cannot apply.
template <bool kCanApply, class Fn>
void with_flag(bool on, const Fn& f) {
  if constexpr (kCanApply) {
    if (on) {
      f(std::true_type{});
      return;
    }
  }
  f(std::false_type{});
}

// Picks the run_fused instantiation for the call's stream types and flags.
template <class Arch, OptKind K>
void dispatch_fused(const TileCall& call, BatchStep<Arch, K>& st, int64_t n, bool native_bf16) {
  auto with_flags = [&](auto g, auto s, auto o) {
    constexpr DType kG = decltype(g)::value;
    constexpr StateType kS = decltype(s)::value;
    constexpr OutKind kO = decltype(o)::value;
    constexpr bool kRoundsBf16 = is_avx512<Arch>() && (kS == StateType::kBF16 || kO == OutKind::kBF16);
    with_flag<K == OptKind::kAdam>(call.c.decoupled, [&](auto dec) {
      with_flag<kRoundsBf16>(native_bf16, [&](auto nat) {
        with_flag<kO != OutKind::kNone>(can_stream_out<Arch, kO>(call.out), [&](auto str) {
          with_flag<true>(call.partials != nullptr, [&](auto stats) {
            constexpr FusedFlags kF{decltype(dec)::value, decltype(nat)::value, decltype(str)::value,
                                    decltype(stats)::value};
            run_fused<Arch, K, kG, kS, kO, kF>(call, st, n);
          });
        });
      });
    });
  };
  auto with_out = [&](auto g, auto s) {
    if (call.out == nullptr) {
      with_flags(g, s, std::integral_constant<OutKind, OutKind::kNone>{});
    } else if (call.out_dtype == DType::kF16) {
      with_flags(g, s, std::integral_constant<OutKind, OutKind::kF16>{});
    } else {
      with_flags(g, s, std::integral_constant<OutKind, OutKind::kBF16>{});
    }
  };
  auto with_state = [&](auto g) {
    switch (call.state_type) {
      case StateType::kF32: with_out(g, std::integral_constant<StateType, StateType::kF32>{}); break;
      case StateType::kBF16: with_out(g, std::integral_constant<StateType, StateType::kBF16>{}); break;
      case StateType::kQ8: with_out(g, std::integral_constant<StateType, StateType::kQ8>{}); break;
    }
  };
  switch (call.grad_dtype) {
    case DType::kF32: with_state(std::integral_constant<DType, DType::kF32>{}); break;
    case DType::kBF16: with_state(std::integral_constant<DType, DType::kBF16>{}); break;
    case DType::kF16: with_state(std::integral_constant<DType, DType::kF16>{}); break;
  }
}

// A tile: the fused path over the largest prefix it can take, the staged
// path over the rest (the span's final partial vector / q8 block).
template <class Arch, OptKind K>
int64_t run_tile(const TileCall& call, bool native_bf16) {
  constexpr int64_t W = xsimd::batch<float, Arch>::size;
  BatchStep<Arch, K> st(call);
  int64_t fused = 0;
  if constexpr (has_lane_moves<Arch>()) {
    int64_t unit = call.state_type == StateType::kQ8 ? kQ8BlockElems : W;
    fused = call.n / unit * unit;
    if (K == OptKind::kAdam && call.state_type == StateType::kQ8 && call.c.decoupled &&
        !q8_scaled_moments(call).usable) {
      fused = 0;
    }
    if (st.roots == Roots::kExact) fused = 0;
    dispatch_fused<Arch, K>(call, st, fused, native_bf16);
    // The fused loop flushes whole partials; a short last one with no staged
    // rest to finish it ends here.
    if (st.stats && fused == call.n && call.n % kSub != 0) st.flush_square(call.partials, (call.n - 1) / kSub);
  }
  if (fused < call.n) {
    const TileCall rest = call.advanced(fused);
    run_staged<Arch, K>(rest, st, fused);
  }
  if (!st.saw_nonfinite()) return 0;
  if (call.partials != nullptr) {
    // Rare: StatsKernel's partials leave the non-finite elements out.
    int64_t bad = 0;
    StatsKernel{}(Arch{}, call.grad, call.grad_dtype, call.n, call.grad_scale, call.partials, &bad);
    return bad;
  }
  return count_nonfinite_scalar(call.grad, call.grad_dtype, call.n);
}

template <class Arch>
int64_t TileKernel::operator()(Arch, const TileCall& call) const {
  switch (call.kind) {
    case OptKind::kAdam:
      return run_tile<Arch, OptKind::kAdam>(call, native_bf16);
    case OptKind::kAdagrad:
      return run_tile<Arch, OptKind::kAdagrad>(call, native_bf16);
    case OptKind::kLion:
      return run_tile<Arch, OptKind::kLion>(call, native_bf16);
    case OptKind::kSgd:
      return run_tile<Arch, OptKind::kSgd>(call, native_bf16);
  }
  return 0;
}

// One sub-tile's running sums straight from the typed gradient: the full
// batches loaded and widened in registers (lane-move ISAs), the last partial
// batch through zero-padded scratch.
template <class Arch, DType G>
void stats_direct(const void* grad, int64_t len, float scale, xsimd::batch<float, Arch>& acc,
                  xsimd::batch<float, Arch>& check) {
  using B = xsimd::batch<float, Arch>;
  constexpr int64_t W = B::size;
  const B zero(0.0f), s(scale);
  int64_t i = 0;
  for (; i + W <= len; i += W) {
    // As the update over bf16 states does: without it one core kept too
    // few reads in flight (a read-only pass ran at about 8 GB/s per core
    // on an earlier host).
    prefetch_ahead<static_cast<int64_t>(dtype_bytes(G))>(grad, i);
    B x = load_as_f32<Arch>(grad, G, i);
    check = fused_fma<Arch>(x, zero, check);
    x = x * s;
    acc = fused_fma<Arch>(x, x, acc);
  }
  if (i < len) {
    alignas(64) float t[W] = {};
    to_f32<Arch>(static_cast<const std::byte*>(grad) + i * dtype_bytes(G), G, len - i, t);
    B x = B::load_aligned(t);
    check = fused_fma<Arch>(x, zero, check);
    x = x * s;
    acc = fused_fma<Arch>(x, x, acc);
  }
}

template <class Arch>
void StatsKernel::operator()(Arch, const void* grad, DType dtype, int64_t n, float scale, double* partials,
                             int64_t* nonfinite) const {
  using B = xsimd::batch<float, Arch>;
  constexpr int64_t W = B::size;
  alignas(64) float g[kSub];
  int64_t bad = 0;
  for (int64_t off = 0; off < n; off += kSub) {
    const int64_t len = std::min(kSub, n - off);
    const int64_t padded = (len + W - 1) / W * W;
    const std::byte* src = static_cast<const std::byte*>(grad) + off * dtype_bytes(dtype);
    B acc(0.0f), check(0.0f);
    const B zero(0.0f), s(scale);
    if constexpr (has_lane_moves<Arch>()) {
      // The same lanes, products and order as the scratch loop below.
      switch (dtype) {
        case DType::kF32:
          stats_direct<Arch, DType::kF32>(src, len, scale, acc, check);
          break;
        case DType::kBF16:
          stats_direct<Arch, DType::kBF16>(src, len, scale, acc, check);
          break;
        case DType::kF16:
          stats_direct<Arch, DType::kF16>(src, len, scale, acc, check);
          break;
      }
    } else {
      to_f32<Arch>(src, dtype, len, g);
      std::memset(g + len, 0, static_cast<size_t>(padded - len) * 4);
      for (int64_t i = 0; i < padded; i += W) {
        B x = B::load_aligned(g + i);
        check = fused_fma<Arch>(x, zero, check);
        x = x * s;
        acc = fused_fma<Arch>(x, x, acc);
      }
    }
    if (!xsimd::all(xsimd::isfinite(check))) {
      // Rare: recount, and redo the sum without the non-finite elements.
      to_f32<Arch>(src, dtype, len, g);
      std::memset(g + len, 0, static_cast<size_t>(padded - len) * 4);
      bad += count_nonfinite_scalar(g, DType::kF32, len);
      acc = zero;
      for (int64_t i = 0; i < padded; i += W) {
        B x = B::load_aligned(g + i);
        x = xsimd::select(xsimd::isfinite(x), x, zero) * s;
        acc = fused_fma<Arch>(x, x, acc);
      }
    }
    // One partial per sub-tile; the caller adds them in order in fp64.
    partials[off / kSub] = static_cast<double>(xsimd::hadd(acc));
  }
  *nonfinite = bad;
}

template <class Arch>
void ConvertKernel::operator()(Arch, const void* src, DType src_type, void* dst, DType dst_type, int64_t n) const {
  alignas(64) float f[kSub];
  for (int64_t off = 0; off < n; off += kSub) {
    const int64_t len = std::min(kSub, n - off);
    to_f32<Arch>(static_cast<const std::byte*>(src) + off * dtype_bytes(src_type), src_type, len, f);
    from_f32<Arch>(f, dst_type, len, static_cast<std::byte*>(dst) + off * dtype_bytes(dst_type));
  }
}

template <class Arch>
void Q8EncodeKernel::operator()(Arch, const float* src, int64_t n, bool is_v, void* codes, float* scales) const {
  q8_store<Arch>(src, is_v, n, codes, scales);
}

template <class Arch>
void Q8DecodeKernel::operator()(Arch, const void* codes, const float* scales, int64_t n, bool is_v,
                                float* dst) const {
  q8_load<Arch>(codes, scales, is_v, n, dst);
}

}  // namespace strata::cpu_optim::detail

// Explicit instantiations for one architecture.
#define STRATA_CPU_OPTIM_INSTANTIATE(ARCH)                                                                    \
  template int64_t strata::cpu_optim::detail::TileKernel::operator()<ARCH>(ARCH, const TileCall&) const;      \
  template void strata::cpu_optim::detail::StatsKernel::operator()<ARCH>(ARCH, const void*, DType, int64_t,   \
                                                                          float, double*, int64_t*) const;    \
  template void strata::cpu_optim::detail::ConvertKernel::operator()<ARCH>(ARCH, const void*, DType, void*,   \
                                                                            DType, int64_t) const;      \
  template void strata::cpu_optim::detail::Q8EncodeKernel::operator()<ARCH>(ARCH, const float*, int64_t, bool, \
                                                                             void*, float*) const;            \
  template void strata::cpu_optim::detail::Q8DecodeKernel::operator()<ARCH>(ARCH, const void*, const float*,  \
                                                                             int64_t, bool, float*) const;
