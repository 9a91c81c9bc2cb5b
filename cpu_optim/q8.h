// The 8-bit blockwise state format (one fp32 scale per kQ8BlockElems
// elements), shared by the scalar reference and the vector kernels — it is a
// storage definition, so both must produce the same codes.
//
// Linear absmax codes waste most of 8 bits when a block mixes large and small
// values (in a transformer, a block of Adam states easily spans 100x), so the
// codes are companded, in the spirit of 8-bit Adam's non-linear maps:
//   m: scale = max |m|;        code = round(127 * sign(m) * sqrt(|m| / scale))
//                              m    = sign(code) * (code / 127)^2 * scale
//   v: scale = max sqrt(v);    w = sqrt(v); code = round(255 * sqrt(w / scale))
//                              w    = (code / 255)^2 * scale; v = w^2
// (so v is effectively stored as v^(1/4)). v's code 0 decodes to half a step,
// not 0: a non-zero m over a v that rounded to zero must not divide by eps.
// Rounding is to nearest even; NaN encodes as 0.
#pragma once

#include <cmath>
#include <cstdint>

namespace strata::cpu_optim {

// Adding and removing 1.5 * 2^23 rounds |x| < 2^22 to nearest even with plain
// float arithmetic (we build without -ffast-math and with -ffp-contract=off).
inline float q8_round(float x) { return x + 12582912.0f - 12582912.0f; }

inline float q8_m_scale_of(float m) { return std::fabs(m); }
inline float q8_v_scale_of(float v) { return std::sqrt(v); }
// Encoders take 1 / scale (0 for an all-zero block), computed once per block.
inline float q8_inverse(float scale) { return scale > 0.0f ? 1.0f / scale : 0.0f; }

inline int8_t q8_m_encode(float m, float inv_scale) {
  float r = std::sqrt(std::fabs(m) * inv_scale);
  float x = q8_round(127.0f * r);
  x = x > 127.0f ? 127.0f : x;
  x = x == x ? x : 0.0f;
  return static_cast<int8_t>(m < 0.0f ? -x : x);
}

inline float q8_m_decode(int8_t code, float scale) {
  float r = static_cast<float>(code) * (1.0f / 127.0f);
  return (code < 0 ? -r * r : r * r) * scale;
}

inline uint8_t q8_v_encode(float v, float inv_scale) {
  float r = std::sqrt(std::sqrt(v) * inv_scale);
  float x = q8_round(255.0f * r);
  x = x > 255.0f ? 255.0f : x;
  return static_cast<uint8_t>(x >= 0.0f ? x : 0.0f);
}

inline float q8_v_decode(uint8_t code, float scale) {
  float r = (code == 0 ? 0.5f : static_cast<float>(code)) * (1.0f / 255.0f);
  float w = r * r * scale;
  return w * w;
}

}  // namespace strata::cpu_optim
