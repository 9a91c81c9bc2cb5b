// The 8-bit state format (q8.h): the encoders give the nearest code (ties
// to the larger magnitude) of the mini-float grid, every compiled ISA gives
// the scalar codes and scales bit for bit, and a decoded value is within
// half a step (relative, or half the smallest step) of what was encoded.
#include "cpu_optim/q8.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "cpu_optim/optimizer.h"
#include "tests/test_util.h"

namespace strata::cpu_optim {
namespace {

// The grid before m's shift, from the format's definition: m's code c
// stands for 2^(k / 16 - 127) * (1 + (k % 16) / 16) with k = c + 1920, less
// 2^-7 (so code 0 is 0), up to 1.9296875; v's for 2^(k / 8 - 127) * (1 +
// (k % 8) / 8) with k = c + 761, up to 1.0 (code 255).
double unshifted(uint32_t c, bool is_v) {
  const int mant = is_v ? 3 : 4, k = static_cast<int>(c) + (is_v ? 761 : 1920);
  return std::ldexp(1.0 + static_cast<double>(k & ((1 << mant) - 1)) / (1 << mant), (k >> mant) - 127);
}
double grid(uint32_t c, bool is_v) { return is_v ? unshifted(c, true) : unshifted(c, false) - 0x1p-7; }

// The code of y (relative to the block's factor of 1) by search: m's y goes
// through the fp32 fused multiply-add the encoder forms (|y| + 2^-7, one
// rounding), then the nearest unshifted grid point wins, ties to the
// larger; v below its code 0's lower half-step: code 0.
uint32_t nearest_code(float y, bool is_v) {
  const double t = is_v ? std::fabs(static_cast<double>(y))
                        : static_cast<double>(std::fma(std::fabs(y), 1.0f, 0x1p-7f));
  const uint32_t max_code = is_v ? 255 : 127;
  uint32_t best = 0;
  for (uint32_t c = 1; c <= max_code; ++c) {
    if (std::fabs(unshifted(c, is_v) - t) <= std::fabs(unshifted(best, is_v) - t)) best = c;
  }
  return best;
}

// y in [0, top] (top: 1.9375 for m, 1 for v): every grid point, the
// midpoints and their neighbours (+-3 ulps), tiny and subnormal values, and
// uniform and log-uniform draws.
std::vector<float> probe_values(bool is_v, uint64_t seed) {
  std::vector<float> y = {0.0f, std::numeric_limits<float>::denorm_min(), 1e-38f, 1e-30f, 1e-12f, 1.0f};
  const uint32_t top_code = is_v ? 255 : 127;
  const auto top = static_cast<float>(grid(top_code, is_v));
  y.push_back(top);
  for (uint32_t c = 0; c < top_code; ++c) {
    const auto mid = static_cast<float>((grid(c, is_v) + grid(c + 1, is_v)) / 2);
    float lo = mid, hi = mid;
    y.push_back(static_cast<float>(grid(c, is_v)));
    y.push_back(mid);
    for (int s = 0; s < 3; ++s) {
      lo = std::nextafter(lo, 0.0f);
      hi = std::nextafter(hi, top);
      y.push_back(lo);
      y.push_back(hi);
    }
  }
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(0.0f, top);
  for (int i = 0; i < 20000; ++i) y.push_back(u(rng));
  std::uniform_real_distribution<float> e(-40.0f, std::log2(top));
  for (int i = 0; i < 4000; ++i) y.push_back(std::exp2(e(rng)));
  return y;
}

TEST(Q8, ScalarEncodersGiveTheNearestCode) {
  uint64_t seed = strata::testing::test_seed(17);
  for (float y : probe_values(false, seed)) {
    const auto want = static_cast<int>(nearest_code(y, false));
    ASSERT_EQ(static_cast<uint8_t>(q8_m_encode(y, 1.0f)), want) << "m, y = " << y << " bits " << std::hex
                                                                 << std::bit_cast<uint32_t>(y);
    ASSERT_EQ(static_cast<uint8_t>(q8_m_encode(-y, 1.0f)), want | 0x80) << "m, y = -" << y;
    // Decoding gives the grid point back, with the sign.
    ASSERT_EQ(q8_m_decode(q8_m_encode(-y, 1.0f), 1.0f), -static_cast<float>(grid(static_cast<uint32_t>(want), false)));
  }
  for (float y : probe_values(true, seed + 1)) {
    const auto want = static_cast<int>(nearest_code(y, true));
    ASSERT_EQ(q8_v_encode(y, 1.0f), want) << "v, y = " << y << " bits " << std::hex << std::bit_cast<uint32_t>(y);
    ASSERT_EQ(q8_v_decode(static_cast<uint8_t>(want), 1.0f), static_cast<float>(grid(static_cast<uint32_t>(want), true)));
  }
  // m's code 0 is 0, v's a value just below its code 1 (never 0); NaN takes the largest code.
  EXPECT_EQ(q8_m_decode(0, 1.0f), 0.0f);
  EXPECT_GT(q8_v_decode(0, 1.0f), 0.0f);
  EXPECT_LT(q8_v_decode(0, 1.0f), q8_v_decode(1, 1.0f));
  EXPECT_EQ(static_cast<uint8_t>(q8_m_encode(std::nanf(""), 1.0f)) & 0x7F, 127);
  EXPECT_EQ(q8_v_encode(std::nanf(""), 1.0f), 255);
  // A block's largest value is its scale, and takes the top code.
  EXPECT_EQ(q8_m_encode(-3.7f, q8_encode_factor(3.7f, false)), static_cast<int8_t>(0xFF));
  EXPECT_EQ(q8_v_encode(3.7f, q8_encode_factor(3.7f, true)), 255);
  EXPECT_NEAR(q8_m_decode(static_cast<int8_t>(0xFF), q8_decode_factor(3.7f, false)), -3.7f, 1e-6f);
  EXPECT_EQ(q8_v_decode(255, q8_decode_factor(3.7f, true)), 3.7f);
}

// Blocks of kQ8BlockElems whose largest element sets the scale (1, powers
// of two, and others), then an all-zero block, a NaN, and a tail.
std::vector<float> block_inputs(bool is_v, uint64_t seed) {
  std::vector<float> probes = probe_values(is_v, seed);
  std::vector<float> x;
  // (1e-39 and 3e-42: subnormal largest values, whose encoding factor would
  // overflow without the scale's floor.)
  const float scales[] = {1.0f, 0.25f, 1024.0f, 3.7f, 1e-20f, 6e15f, 1e-39f, 3e-42f};
  size_t p = 0;
  for (int round = 0; round < 2; ++round) {
    for (float s : scales) {
      for (size_t b = 0; b < 8; ++b) {  // 2 x 8 x 8 blocks: every probe at least once
        x.push_back(s);  // the block's largest element
        for (int64_t i = 1; i < kQ8BlockElems; ++i) {
          float y = probes[p++ % probes.size()] * s;
          x.push_back(!is_v && (i % 3 == 0) ? -y : y);
        }
      }
    }
  }
  x.insert(x.end(), kQ8BlockElems, 0.0f);
  std::vector<float> odd(kQ8BlockElems, 0.5f);
  odd[7] = std::nanf("");
  x.insert(x.end(), odd.begin(), odd.end());
  for (int i = 0; i < 37; ++i) x.push_back(static_cast<float>(i) * 0.01f);  // a short last block
  return x;
}

TEST(Q8, EveryIsaGivesTheScalarCodesAndScales) {
  uint64_t seed = strata::testing::test_seed(23);
  for (Q8Array which : {Q8Array::kM, Q8Array::kV}) {
    const bool is_v = which == Q8Array::kV;
    std::vector<float> x = block_inputs(is_v, seed);
    const auto n = static_cast<int64_t>(x.size());
    const auto blocks = static_cast<size_t>((n + kQ8BlockElems - 1) / kQ8BlockElems);
    std::vector<uint8_t> ref_codes(x.size());
    std::vector<float> ref_scales(blocks), ref_back(x.size());
    ASSERT_TRUE(q8_encode(x.data(), n, which, ref_codes.data(), ref_scales.data(), Isa::kScalar).ok());
    ASSERT_TRUE(q8_decode(ref_codes.data(), ref_scales.data(), n, which, ref_back.data(), Isa::kScalar).ok());
    for (Isa isa : available_isas()) {
      SCOPED_TRACE(std::string(is_v ? "v " : "m ") + std::string(isa_name(isa)));
      std::vector<uint8_t> codes(x.size());
      std::vector<float> scales(blocks), back(x.size());
      ASSERT_TRUE(q8_encode(x.data(), n, which, codes.data(), scales.data(), isa).ok());
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(codes[i], ref_codes[i]) << "element " << i << " = " << x[i] << " (block scale "
                                          << ref_scales[i / kQ8BlockElems] << ")";
      }
      ASSERT_EQ(std::memcmp(scales.data(), ref_scales.data(), blocks * sizeof(float)), 0);
      ASSERT_TRUE(q8_decode(codes.data(), scales.data(), n, which, back.data(), isa).ok());
      ASSERT_EQ(std::memcmp(back.data(), ref_back.data(), back.size() * sizeof(float)), 0);
    }
  }
}

// Decoded values lie within half a step of the encoded ones: 1/32 (m) or
// 1/16 (v) of the value, or half a linear step of m (2^-12 / 1.9296875 of
// the scale), or v's code 0 (1.125 * 2^-32 of the scale).
TEST(Q8, DecodedValuesAreWithinHalfAStep) {
  uint64_t seed = strata::testing::test_seed(29);
  for (Q8Array which : {Q8Array::kM, Q8Array::kV}) {
    const bool is_v = which == Q8Array::kV;
    std::vector<float> x = block_inputs(is_v, seed);
    x.resize(x.size() - kQ8BlockElems - 37 - kQ8BlockElems);  // drop the zero, NaN and tail blocks
    const auto n = static_cast<int64_t>(x.size());
    std::vector<uint8_t> codes(x.size());
    std::vector<float> scales(static_cast<size_t>(n / kQ8BlockElems)), back(x.size());
    ASSERT_TRUE(q8_encode(x.data(), n, which, codes.data(), scales.data()).ok());
    ASSERT_TRUE(q8_decode(codes.data(), scales.data(), n, which, back.data()).ok());
    for (int64_t i = 0; i < n; ++i) {
      const double s = scales[static_cast<size_t>(i / kQ8BlockElems)];
      const double a = x[i], b = back[i];
      const double tol = std::fabs(a) / (is_v ? 16 : 32) + s * (is_v ? 1.125 * 0x1p-32 : 0x1p-12 / 1.9296875);
      ASSERT_LE(std::fabs(a - b), tol * (1 + 1e-6)) << "element " << i << " = " << x[i] << " (scale " << s << ")";
      if (!is_v && x[i] != 0.0f && back[i] != 0.0f) {
        ASSERT_EQ(std::signbit(x[i]), std::signbit(back[i])) << "element " << i;
      }
    }
  }
}

TEST(Q8, RefusesNullPointers) {
  float s = 0;
  uint8_t c = 0;
  EXPECT_FALSE(q8_encode(nullptr, 1, Q8Array::kM, &c, &s).ok());
  EXPECT_FALSE(q8_decode(&c, nullptr, 1, Q8Array::kV, &s).ok());
  EXPECT_TRUE(q8_encode(nullptr, 0, Q8Array::kM, nullptr, nullptr).ok());
}

}  // namespace
}  // namespace strata::cpu_optim
