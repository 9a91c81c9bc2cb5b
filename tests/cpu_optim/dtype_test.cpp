// bf16/fp16 conversions: rounding on ties, subnormals, +-inf and NaN for the
// scalar reference, and bitwise agreement of every compiled vector ISA with it.
#include "cpu_optim/dtype.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "cpu_optim/optimizer.h"
#include "tests/test_util.h"

namespace strata::cpu_optim {
namespace {

float bits(uint32_t u) { return std::bit_cast<float>(u); }

TEST(Bf16, RoundsToNearestEvenOnTies) {
  // 1 + 2^-8 lies exactly between bf16 1.0 (0x3F80) and 1.0078125 (0x3F81): even wins.
  EXPECT_EQ(f32_to_bf16(bits(0x3F808000u)), 0x3F80u);
  // 0x3F818000 lies between 0x3F81 and 0x3F82: even (0x3F82) wins.
  EXPECT_EQ(f32_to_bf16(bits(0x3F818000u)), 0x3F82u);
  EXPECT_EQ(f32_to_bf16(bits(0x3F808001u)), 0x3F81u);  // just above the tie
  EXPECT_EQ(f32_to_bf16(bits(0x3F807FFFu)), 0x3F80u);  // just below
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::infinity()), 0x7F80u);
  EXPECT_EQ(f32_to_bf16(-std::numeric_limits<float>::infinity()), 0xFF80u);
  EXPECT_EQ(f32_to_bf16(bits(0x7F7FFFFFu)), 0x7F80u);  // FLT_MAX rounds up to inf
  uint16_t nan = f32_to_bf16(bits(0x7F800001u));       // signalling NaN stays NaN
  EXPECT_TRUE(std::isnan(bf16_to_f32(nan)));
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(-std::nanf("")))));
  EXPECT_EQ(f32_to_bf16(bits(0x00010000u)), 0x0001u);  // subnormal kept
  EXPECT_EQ(f32_to_bf16(-0.0f), 0x8000u);
}

TEST(Fp16, RoundsToNearestEvenWithSubnormalsInfAndNan) {
  EXPECT_EQ(f32_to_f16(1.0f), 0x3C00u);
  // 1 + 2^-11 is the tie between 1.0 and 1 + 2^-10: even (1.0).
  EXPECT_EQ(f32_to_f16(1.0f + 0x1p-11f), 0x3C00u);
  EXPECT_EQ(f32_to_f16(1.0f + 0x1p-10f + 0x1p-11f), 0x3C02u);  // tie rounding up to even
  EXPECT_EQ(f32_to_f16(65504.0f), 0x7BFFu);
  EXPECT_EQ(f32_to_f16(65519.0f), 0x7BFFu);  // below the overflow tie
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7C00u);  // the tie rounds to inf
  EXPECT_EQ(f32_to_f16(0x1p-24f), 0x0001u);  // smallest subnormal
  EXPECT_EQ(f32_to_f16(0x1p-25f), 0x0000u);  // half of it: tie to even (0)
  EXPECT_EQ(f32_to_f16(0x1.8p-24f), 0x0002u);  // 1.5 quanta: tie to even (2)
  EXPECT_EQ(f32_to_f16(0x1p-14f), 0x0400u);  // smallest normal
  EXPECT_EQ(f32_to_f16(-std::numeric_limits<float>::infinity()), 0xFC00u);
  EXPECT_EQ(f32_to_f16(bits(0x7FC00000u)), 0x7E00u);
  EXPECT_TRUE(std::isnan(f16_to_f32(0x7C01u)));
  EXPECT_EQ(f16_to_f32(0x0001u), 0x1p-24f);
  EXPECT_EQ(f16_to_f32(0xFC00u), -std::numeric_limits<float>::infinity());
  // Every finite fp16 survives fp16 -> fp32 -> fp16 exactly.
  for (uint32_t h = 0; h < 0x10000u; ++h) {
    if ((h & 0x7C00u) == 0x7C00u && (h & 0x3FFu) != 0) continue;  // NaNs: payload quieted
    ASSERT_EQ(f32_to_f16(f16_to_f32(static_cast<uint16_t>(h))), h) << std::hex << h;
  }
}

// Special values plus random bit patterns, at an odd length.
std::vector<float> conversion_inputs(uint64_t seed) {
  std::vector<float> x = {0.0f, -0.0f, 1.0f, bits(0x3F808000u), bits(0x3F818000u), 1.0f + 0x1p-11f, 65504.0f,
                          65520.0f, 0x1p-24f, 0x1p-25f, 0x1.8p-24f, 0x1p-14f, bits(0x00010000u), bits(0x7F800001u),
                          bits(0xFFC00001u), std::numeric_limits<float>::infinity(),
                          -std::numeric_limits<float>::infinity(), bits(0x7F7FFFFFu)};
  std::mt19937 rng(static_cast<uint32_t>(seed));
  while (x.size() < 4099) x.push_back(bits(rng()));
  return x;
}

TEST(Convert, EveryIsaMatchesTheScalarConversionBitwise) {
  uint64_t seed = strata::testing::test_seed(41);
  std::vector<float> x = conversion_inputs(seed);
  int64_t n = static_cast<int64_t>(x.size());
  for (Isa isa : available_isas()) {
    SCOPED_TRACE(std::string(isa_name(isa)));
    for (DType t : {DType::kBF16, DType::kF16}) {
      std::vector<uint16_t> got(x.size()), back_ref(x.size());
      std::vector<float> back(x.size());
      ASSERT_TRUE(convert(x.data(), DType::kF32, got.data(), t, n, isa).ok());
      for (int64_t i = 0; i < n; ++i) {
        uint16_t want = t == DType::kBF16 ? f32_to_bf16(x[i]) : f32_to_f16(x[i]);
        ASSERT_EQ(got[i], want) << dtype_name(t) << " element " << i << " input bits " << std::hex
                                << std::bit_cast<uint32_t>(x[i]);
      }
      ASSERT_TRUE(convert(got.data(), t, back.data(), DType::kF32, n, isa).ok());
      for (int64_t i = 0; i < n; ++i) {
        float want = t == DType::kBF16 ? bf16_to_f32(got[i]) : f16_to_f32(got[i]);
        ASSERT_EQ(std::bit_cast<uint32_t>(back[i]), std::bit_cast<uint32_t>(want))
            << dtype_name(t) << " element " << i << " half bits " << std::hex << got[i];
      }
    }
  }
}

TEST(StateType, NamesRoundTripAndBytesPerParameter) {
  for (StateType t : {StateType::kF32, StateType::kBF16, StateType::kQ8}) {
    Result<StateType> back = parse_state_type(state_type_name(t));
    ASSERT_TRUE(back);
    EXPECT_EQ(*back, t);
  }
  Result<StateType> bad = parse_state_type("fp8");
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().message().find("fp32, bf16 or q8"), std::string::npos) << bad.error().to_string();
  // m and v together, scales included: what state_array_bytes stores per element, twice.
  for (StateType t : {StateType::kF32, StateType::kBF16, StateType::kQ8}) {
    const double per = 2.0 * static_cast<double>(state_array_bytes(t, 1 << 20)) / (1 << 20);
    EXPECT_DOUBLE_EQ(adam_state_bytes_per_param(t), per) << state_type_name(t);
  }
}

}  // namespace
}  // namespace strata::cpu_optim
