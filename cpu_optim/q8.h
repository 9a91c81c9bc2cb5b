// The 8-bit blockwise state format (one fp32 scale per kQ8BlockElems
// elements), shared by the scalar reference and the vector kernels — it is a
// storage definition, so both must produce the same codes.
//
// Linear absmax codes waste most of 8 bits when a block mixes large and small
// values (in a transformer, a block of Adam states easily spans 100x), so
// the codes are small floating-point numbers relative to the block's largest
// value, in the spirit of 8-bit Adam's dynamic (exponent-carrying) maps:
//   m: int8, sign and magnitude: bit 7 the sign, bits 0..6 a 3-exponent,
//      4-mantissa-bit float shifted so that 0 is a code (see below):
//      |m| / scale in steps of 1/16 relative above 2^-7, of 2^-11 below;
//      scale = max |m| (floored: q8_floored_scale);
//   v: uint8, an E5M3 number: v / scale in [2^-30, 1] in steps of 1/8
//      relative, down to 2^-33; scale = max v (floored).
// A code, offset and shifted left by 23 - mantissa bits, is the bit
// pattern of an fp32 number, so decoding is an add, a shift (m: and a
// subtraction) and a multiplication, and encoding a multiplication (m: and
// an addition), an integer add of half a step (round half up), a shift and
// a clamp — no divide, root or table. The scale is the block's largest
// value itself, not a power of two: it moves a little every step, so the
// grid does too, and a
// state whose per-step change is below half a step (v's is 0.1% at beta2 =
// 0.999) is not pinned to its code (with power-of-two scales Adam's v stuck
// and the steps shrank: tests/cpu_optim/optimizer_test.cpp's accuracy test
// found it). v's code 0 decodes to a value just below its code 1, not 0: a
// non-zero m over a v that rounded to zero must not divide by eps. NaN
// encodes as the largest code.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

namespace strata::cpu_optim {

// The value each element contributes to its block's scale (the largest).
inline float q8_scale_of(float x, bool is_v) { return is_v ? x : std::fabs(x); }

// m: a 3-exponent, 4-mantissa-bit float shifted down by its smallest
// value, so that code 0 is 0 and the codes below 16 are linear: code c is
// the fp32 number with bits (c + kQ8MOffset) << 19, less kQ8MZero = 2^-7 —
// c * 2^-11 for c < 16, 2^(c / 16 - 8) * (1 + (c % 16) / 16) - 2^-7 above.
// The top code is 1.9296875, where the block's largest |m| lands.
inline constexpr int32_t kQ8MMax = 127;
inline constexpr int kQ8MShift = 19;
inline constexpr int32_t kQ8MOffset = 120 << 4;                            // code 0 is 2^-7 before the shift
inline constexpr int32_t kQ8MAdd = (1 << 18) - (kQ8MOffset << kQ8MShift);  // half a step, less the offset
inline constexpr float kQ8MZero = 0x1p-7f;
inline constexpr float kQ8MTop = 1.9296875f;  // 1.9375 - 2^-7
// v: E5M3 without subnormals: code c is the fp32 number with bits
// (c + kQ8VOffset) << 20; the top code is 1.0, where the block's largest v
// lands; code 0 (1.125 * 2^-32) is also where anything below the grid goes.
inline constexpr int32_t kQ8VMax = 255;
inline constexpr int kQ8VShift = 20;
inline constexpr int32_t kQ8VOffset = (127 << 3) - kQ8VMax;
inline constexpr int32_t kQ8VAdd = (1 << 19) - (kQ8VOffset << kQ8VShift);

// A block's scale from its largest value `top`: at least `floor` (the
// smallest normal number unless a caller scales its values) when the block
// is not all zero, so that the encoding factor below stays finite — the
// top code over a subnormal largest value overflows to inf, and every
// element of the block, zeros too, would take the top code. A block whose
// values are all below the floor is encoded on the floor's grid (m's
// linear codes reach 2^-11 / 1.93 of it, far below the values' own
// precision there). 0 stays 0; top is never NaN (the running maxima keep
// NaN out).
inline constexpr float kQ8MinScale = std::numeric_limits<float>::min();
inline float q8_floored_scale(float top, float floor = kQ8MinScale) {
  return top > 0.0f ? std::max(top, floor) : top;
}

// Per block: what encoding multiplies values by (the top code's value over
// the scale; 0 for an all-zero block), and decoding codes by. With a
// floored scale neither overflows.
inline float q8_encode_factor(float scale, bool is_v) {
  return scale > 0.0f ? (is_v ? 1.0f : kQ8MTop) / scale : 0.0f;
}
inline float q8_decode_factor(float scale, bool is_v) { return is_v ? scale : scale * (1.0f / kQ8MTop); }

// The normal-range code of t from its fp32 bits: rounded half up (the add),
// then an arithmetic shift (below the range: negative).
inline int32_t q8_shifted_code(float t, int32_t add, int shift) {
  return static_cast<int32_t>(std::bit_cast<uint32_t>(t) + static_cast<uint32_t>(add)) >> shift;
}

inline int8_t q8_m_encode(float m, float factor) {
  // |m| * factor + 2^-7, rounded once (a fused multiply-add, as the vector
  // code does); then its bits round half up to the grid (y >= 2^-7, so the
  // code is >= 0; NaN takes the top code).
  const float y = std::fma(std::fabs(m), factor, kQ8MZero);
  const int32_t c = std::min(q8_shifted_code(y, kQ8MAdd, kQ8MShift), kQ8MMax);
  const uint32_t sign = (std::bit_cast<uint32_t>(m) >> 24) & 0x80u;
  return static_cast<int8_t>(static_cast<uint8_t>(static_cast<uint32_t>(c) | sign));
}

inline float q8_m_decode(int8_t code, float factor) {
  const auto c = static_cast<uint32_t>(static_cast<uint8_t>(code));
  const float mag = std::bit_cast<float>(((c & 0x7Fu) + kQ8MOffset) << kQ8MShift) - kQ8MZero;  // exact
  return std::bit_cast<float>(std::bit_cast<uint32_t>(mag) | ((c & 0x80u) << 24)) * factor;
}

inline uint8_t q8_v_encode(float v, float factor) {
  return static_cast<uint8_t>(std::min(std::max(q8_shifted_code(v * factor, kQ8VAdd, kQ8VShift), 0), kQ8VMax));
}

inline float q8_v_decode(uint8_t code, float factor) {
  return std::bit_cast<float>((static_cast<uint32_t>(code) + kQ8VOffset) << kQ8VShift) * factor;
}

}  // namespace strata::cpu_optim
