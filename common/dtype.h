// Element types shared by every layer (fp32, fp16, bf16) and their scalar
// conversions. These are the reference conversions: vector and GPU kernels
// must produce the same bits.
//   fp32 -> bf16: round to nearest, ties to even; NaN stays NaN (quiet bit
//                 set, sign and top payload bits kept); overflow rounds to inf.
//   fp32 -> fp16: IEEE 754 binary16, round to nearest even, with subnormals;
//                 NaN -> sign | 0x7E00 | top payload bits (as F16C's vcvtps2ph).
#pragma once

#include <bit>
#include <cstdint>
#include <optional>
#include <string_view>

namespace strata {

enum class DType : uint8_t { kF32, kF16, kBF16 };
constexpr uint64_t dtype_bytes(DType t) { return t == DType::kF32 ? 4 : 2; }
std::string_view dtype_name(DType t);
// The type dtype_name calls `name` ("fp32", "fp16", "bf16"); none for another.
std::optional<DType> dtype_from_name(std::string_view name);

inline float bf16_to_f32(uint16_t h) { return std::bit_cast<float>(uint32_t{h} << 16); }

inline uint16_t f32_to_bf16(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  return static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

inline float f16_to_f32(uint16_t h) {
  uint32_t sign = uint32_t{h & 0x8000u} << 16;
  uint32_t exp = (h >> 10) & 0x1Fu;
  uint32_t mant = h & 0x3FFu;
  if (exp == 0x1F) {
    // inf stays inf; NaN gets the quiet bit (as F16C's vcvtph2ps does).
    return std::bit_cast<float>(sign | 0x7F800000u | (mant != 0 ? 0x400000u : 0u) | (mant << 13));
  }
  if (exp == 0) {
    if (mant == 0) return std::bit_cast<float>(sign);
    // Subnormal: value = mant * 2^-24, exact in fp32.
    float v = static_cast<float>(mant) * 0x1p-24f;
    return sign ? -v : v;
  }
  return std::bit_cast<float>(sign | ((exp + 112) << 23) | (mant << 13));
}

inline uint16_t f32_to_f16(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  uint32_t abs = u & 0x7FFFFFFFu;
  if (abs > 0x7F800000u) return static_cast<uint16_t>(sign | 0x7E00u | ((abs >> 13) & 0x3FFu));
  if (abs >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);  // rounds to >= 65520: inf
  int32_t exp = static_cast<int32_t>(abs >> 23) - 127;
  if (exp < -14) {
    // Subnormal or zero in fp16: scale to units of 2^-24 and round to even.
    if (exp < -25) return sign;  // below half the smallest subnormal: +-0
    uint32_t mant = (abs & 0x7FFFFFu) | 0x800000u;
    uint32_t shift = static_cast<uint32_t>(-exp - 1);  // 14..24 => value/2^-24 = mant >> shift
    uint32_t q = mant >> shift;
    uint32_t rem = mant & ((1u << shift) - 1);
    uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1u))) ++q;
    return static_cast<uint16_t>(sign | q);
  }
  uint32_t r = abs + 0xFFFu + ((abs >> 13) & 1u);  // round mantissa to 10 bits, ties to even
  return static_cast<uint16_t>(sign | (((r >> 13) - (112u << 10)) & 0x7FFFu));
}

}  // namespace strata
