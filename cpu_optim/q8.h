// The 8-bit blockwise state format (one fp32 scale per kQ8BlockElems
// elements), shared by the scalar reference and the vector kernels — it is a
// storage definition, so both must produce the same codes.
//
// Linear absmax codes waste most of 8 bits when a block mixes large and small
// values (in a transformer, a block of Adam states easily spans 100x), so
// the codes are small floating-point numbers relative to the block's largest
// value, in the spirit of 8-bit Adam's dynamic (exponent-carrying) maps:
//   m: int8, sign and magnitude: bit 7 the sign, bits 0..6 an E3M4 number
//      (3 exponent bits, 4 mantissa bits, subnormals): |m| / scale in
//      [2^-6, 1] in steps of 1/16 relative, down to 2^-10 in steps of 2^-10;
//      scale = max |m|;
//   v: uint8, an E5M3 number: v / scale in [2^-30, 1] in steps of 1/8
//      relative, down to 2^-33; scale = max v.
// A mini-float's bits, shifted left by 23 - mantissa bits, are those of an
// fp32 number 2^120 (m) or 2^96 (v) times smaller, so decoding is a shift
// and two multiplications, and encoding two multiplications, an integer add
// of half a step (round half up in magnitude), a shift and a clamp — no
// divide, root or table. The scale is the block's largest value itself, not
// a power of two: it moves a little every step, so the grid does too, and a
// state whose per-step change is below half a step (v's is 0.1% at beta2 =
// 0.999) is not pinned to its code (with power-of-two scales Adam's v stuck
// and the steps shrank: tests/cpu_optim/optimizer_test.cpp's accuracy test
// found it). v's code 0 decodes to half the smallest step, not 0: a
// non-zero m over a v that rounded to zero must not divide by eps. NaN
// encodes as the largest code.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>

namespace strata::cpu_optim {

// The value each element contributes to its block's scale (the largest).
inline float q8_m_scale_of(float m) { return std::fabs(m); }
inline float q8_v_scale_of(float v) { return v; }

// m: E3M4 with subnormals. Codes 0..15 are c * 2^-10 (linear); codes
// 16..127 are 2^(c / 16 - 7) * (1 + (c % 16) / 16), the fp32 number with
// bits (c + kQ8MOffset) << 19; the top code is 1.9375, where the block's
// largest |m| lands.
inline constexpr int32_t kQ8MMax = 127;
inline constexpr int kQ8MShift = 19;
inline constexpr int32_t kQ8MLinear = 16;                               // codes below: linear
inline constexpr int32_t kQ8MOffset = (121 << 4) - kQ8MLinear;          // code 16 is 2^-6
inline constexpr int32_t kQ8MAdd = (1 << 18) - (kQ8MOffset << kQ8MShift);  // half a step, less the offset
inline constexpr float kQ8MTop = 1.9375f;
inline constexpr float kQ8MLinearStep = 0x1p-10f;
inline constexpr float kQ8Magic = 0x1p23f;  // adding it rounds [0, 2^22) to an integer in the low mantissa bits
// v: E5M3 without subnormals: code c is the fp32 number with bits
// (c + kQ8VOffset) << 20; the top code is 1.0, where the block's largest v
// lands; code 0 (1.125 * 2^-32) is also where anything below the grid goes.
inline constexpr int32_t kQ8VMax = 255;
inline constexpr int kQ8VShift = 20;
inline constexpr int32_t kQ8VOffset = (127 << 3) - kQ8VMax;
inline constexpr int32_t kQ8VAdd = (1 << 19) - (kQ8VOffset << kQ8VShift);

// Per block: what encoding multiplies values by, and decoding codes by.
inline float q8_m_encode_factor(float scale) { return scale > 0.0f ? kQ8MTop / scale : 0.0f; }
inline float q8_m_decode_factor(float scale) { return scale * (1.0f / kQ8MTop); }
inline float q8_v_encode_factor(float scale) { return scale > 0.0f ? 1.0f / scale : 0.0f; }
inline float q8_v_decode_factor(float scale) { return scale; }

// The normal-range code of t from its fp32 bits: rounded half up (the add),
// then an arithmetic shift (below the range: negative).
inline int32_t q8_shifted_code(float t, int32_t add, int shift) {
  return static_cast<int32_t>(std::bit_cast<uint32_t>(t) + static_cast<uint32_t>(add)) >> shift;
}

inline int8_t q8_m_encode(float m, float factor) {
  const float t = std::fabs(m) * factor;
  // Linear codes: t * 2^10 rounded to nearest (ties to even) by the magic
  // add; at most kQ8MLinear, so the normal-range code wins above 2^-6.
  const int32_t linear =
      static_cast<int32_t>(std::bit_cast<uint32_t>(std::fma(t, 1.0f / kQ8MLinearStep, kQ8Magic)) -
                           std::bit_cast<uint32_t>(kQ8Magic));
  const int32_t c = std::min(std::max(q8_shifted_code(t, kQ8MAdd, kQ8MShift), std::min(linear, kQ8MLinear)), kQ8MMax);
  const uint32_t sign = (std::bit_cast<uint32_t>(m) >> 24) & 0x80u;
  return static_cast<int8_t>(static_cast<uint8_t>(static_cast<uint32_t>(c) | sign));
}

inline float q8_m_decode(int8_t code, float factor) {
  const auto c = static_cast<uint32_t>(static_cast<uint8_t>(code));
  const uint32_t mag = c & 0x7Fu;
  const uint32_t bits = mag < static_cast<uint32_t>(kQ8MLinear)
                            ? std::bit_cast<uint32_t>(static_cast<float>(mag) * kQ8MLinearStep)
                            : (mag + kQ8MOffset) << kQ8MShift;
  return std::bit_cast<float>(bits | ((c & 0x80u) << 24)) * factor;
}

inline uint8_t q8_v_encode(float v, float factor) {
  return static_cast<uint8_t>(std::min(std::max(q8_shifted_code(v * factor, kQ8VAdd, kQ8VShift), 0), kQ8VMax));
}

inline float q8_v_decode(uint8_t code, float factor) {
  return std::bit_cast<float>((static_cast<uint32_t>(code) + kQ8VOffset) << kQ8VShift) * factor;
}

}  // namespace strata::cpu_optim
