// The 8-bit blockwise state format (one fp32 scale per kQ8BlockElems
// elements), shared by the scalar reference and the vector kernels — it is a
// storage definition, so both must produce the same codes.
//
// Linear absmax codes waste most of 8 bits when a block mixes large and small
// values (in a transformer, a block of Adam states easily spans 100x), so the
// codes are companded, in the spirit of 8-bit Adam's non-linear maps:
//   m: scale = max |m|;        y = |m| / scale
//      |code| = round(127 * sqrt(y)),  m = sign(code) * (code / 127)^2 * scale
//   v: scale = max sqrt(v);    y = v / scale^2
//      code = round(255 * y^(1/4)),    w = (code / 255)^2 * scale; v = w^2
// (so v is effectively stored as v^(1/4)). v's code 0 decodes to half a step,
// not 0: a non-zero m over a v that rounded to zero must not divide by eps.
//
// "round" is defined by thresholds, not by a rounded root: the code is the
// number of k in 1..kMax with y >= T(k), where T(k) is the decode curve at
// k - 1/2 computed in fp32 exactly as q8_m_threshold / q8_v_threshold do (so at an exact
// midpoint the code rounds up). Roots need the divider, whose one unit
// per core bound the vector encoder; with thresholds any estimate of the root
// good to a quarter of a code will do: the encoders below estimate
// e = trunc(kMax * root(y) + 3/4), which is the code or the code + 1, and
// step back once when y < T(e). The scalar functions estimate with exact
// roots, the vector kernels with the hardware reciprocal-root estimates;
// both land on the same code (tests/cpu_optim/q8_test.cpp checks that against
// a plain count of thresholds). NaN encodes as 0.
#pragma once

#include <cmath>
#include <cstdint>

namespace strata::cpu_optim {

inline float q8_m_scale_of(float m) { return std::fabs(m); }
inline float q8_v_scale_of(float v) { return std::sqrt(v); }
// Encoders take 1 / scale (0 for an all-zero block), computed once per block.
inline float q8_inverse(float scale) { return scale > 0.0f ? 1.0f / scale : 0.0f; }

inline constexpr float kQ8MMax = 127.0f;
inline constexpr float kQ8VMax = 255.0f;

// T(e): the decode curve's value at e - 1/2 (in units of the block scale),
// for e >= 0 (T(0) = T(1), so a y below T(1) steps 0 back to -1, clamped to
// 0). m's curve is a square, v's a fourth power. fmaf is correctly rounded,
// as the vector FMA is, so both compute the same bits.
inline float q8_m_threshold(float e) {
  float r = std::fma(e, 1.0f / kQ8MMax, -0.5f / kQ8MMax);
  return r * r;
}
inline float q8_v_threshold(float e) {
  float r = std::fma(e, 1.0f / kQ8VMax, -0.5f / kQ8VMax);
  float r2 = r * r;
  return r2 * r2;
}

// The code for y from an estimate e that is the code or the code + 1.
inline float q8_settle(float y, float e, float threshold, float max_code) {
  float c = y < threshold ? e - 1.0f : e;
  return c < 0.0f ? 0.0f : (c > max_code ? max_code : c);
}

inline int8_t q8_m_encode(float m, float inv_scale) {
  float y = std::fabs(m) * inv_scale;
  if (!(y == y)) return 0;
  float e = std::trunc(std::fma(std::sqrt(y), kQ8MMax, 0.75f));
  float c = q8_settle(y, e, q8_m_threshold(e), kQ8MMax);
  return static_cast<int8_t>(m < 0.0f ? -c : c);
}

// Decoding multiplies the squared code by a per-block unit, scale / kMax^2.
inline float q8_m_unit(float scale) { return scale * (1.0f / (kQ8MMax * kQ8MMax)); }
inline float q8_v_unit(float scale) { return scale * (1.0f / (kQ8VMax * kQ8VMax)); }

inline float q8_m_decode(int8_t code, float scale) {
  float c = static_cast<float>(code);
  return c * std::fabs(c) * q8_m_unit(scale);
}

inline uint8_t q8_v_encode(float v, float inv_scale) {
  float y = v * inv_scale * inv_scale;
  if (!(y == y)) return 0;
  float e = std::trunc(std::fma(std::sqrt(std::sqrt(y)), kQ8VMax, 0.75f));
  return static_cast<uint8_t>(q8_settle(y, e, q8_v_threshold(e), kQ8VMax));
}

inline float q8_v_decode(uint8_t code, float scale) {
  float c = code == 0 ? 0.5f : static_cast<float>(code);
  float w = c * c * q8_v_unit(scale);
  return w * w;
}

}  // namespace strata::cpu_optim
