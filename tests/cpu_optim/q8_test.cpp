// The 8-bit state format (q8.h): the encoders give the code that counting
// thresholds gives (the estimate-and-settle shortcut never lands elsewhere),
// every compiled ISA gives the scalar codes and scales bit for bit, and a
// decoded value is within half a code of what was encoded.
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

// The format's definition: the number of k in 1..max_code with y >= T(k).
int threshold_count(float y, bool is_v) {
  const int max_code = is_v ? 255 : 127;
  int c = 0;
  for (int k = 1; k <= max_code; ++k) {
    float t = is_v ? q8_v_threshold(static_cast<float>(k)) : q8_m_threshold(static_cast<float>(k));
    c += y >= t ? 1 : 0;
  }
  return c;
}

// y in [0, 1]: every threshold and its neighbours (+-6 ulps), the ends, tiny
// and subnormal values, and uniform draws.
std::vector<float> probe_values(bool is_v, uint64_t seed) {
  std::vector<float> y = {0.0f, std::numeric_limits<float>::denorm_min(), 1e-38f, 1e-30f, 1e-12f, 1.0f};
  const int max_code = is_v ? 255 : 127;
  for (int k = 1; k <= max_code + 1; ++k) {
    float t = is_v ? q8_v_threshold(static_cast<float>(k)) : q8_m_threshold(static_cast<float>(k));
    float lo = t, hi = t;
    y.push_back(t);
    for (int s = 0; s < 6; ++s) {
      lo = std::nextafter(lo, 0.0f);
      hi = std::nextafter(hi, 2.0f);
      y.push_back(lo);
      if (hi <= 1.0f) y.push_back(hi);
    }
  }
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  for (int i = 0; i < 20000; ++i) y.push_back(u(rng));
  std::uniform_real_distribution<float> e(-40.0f, 0.0f);
  for (int i = 0; i < 4000; ++i) y.push_back(std::exp2(e(rng)));
  return y;
}

TEST(Q8, ThresholdsRiseWithTheCode) {
  for (int k = 1; k < 127; ++k) EXPECT_LT(q8_m_threshold(static_cast<float>(k)), q8_m_threshold(k + 1.0f)) << k;
  for (int k = 1; k < 255; ++k) EXPECT_LT(q8_v_threshold(static_cast<float>(k)), q8_v_threshold(k + 1.0f)) << k;
  // The code-0 threshold is the code-1 one (so a y below it settles on 0).
  EXPECT_EQ(q8_m_threshold(0.0f), q8_m_threshold(1.0f));
  EXPECT_EQ(q8_v_threshold(0.0f), q8_v_threshold(1.0f));
}

TEST(Q8, ScalarEncodersGiveTheThresholdCount) {
  uint64_t seed = strata::testing::test_seed(17);
  for (float y : probe_values(false, seed)) {
    int want = threshold_count(y, false);
    ASSERT_EQ(q8_m_encode(y, 1.0f), want) << "m, y = " << y << " bits " << std::hex << std::bit_cast<uint32_t>(y);
    ASSERT_EQ(q8_m_encode(-y, 1.0f), -want) << "m, y = -" << y;
  }
  for (float y : probe_values(true, seed + 1)) {
    int want = threshold_count(y, true);
    ASSERT_EQ(q8_v_encode(y, 1.0f), want) << "v, y = " << y << " bits " << std::hex << std::bit_cast<uint32_t>(y);
  }
  EXPECT_EQ(q8_m_encode(std::nanf(""), 1.0f), 0);
  EXPECT_EQ(q8_m_encode(-std::nanf(""), 1.0f), 0);
  EXPECT_EQ(q8_v_encode(std::nanf(""), 1.0f), 0);
}

// Blocks of kQ8BlockElems whose largest element sets an exact scale (1, or a
// power of two / four), so the probe values reach the encoders unrounded;
// then blocks with an inexact scale, an all-zero block, a NaN, and a tail.
std::vector<float> block_inputs(bool is_v, uint64_t seed) {
  std::vector<float> probes = probe_values(is_v, seed);
  std::vector<float> x;
  const float scales[] = {1.0f, 0.25f, 1024.0f, 3.7f, 1e-20f, 6e15f};
  size_t p = 0;
  for (int round = 0; round < 2; ++round) {
    for (float s : scales) {
      for (size_t b = 0; b < 24 && p < probes.size(); ++b) {
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

// Decoded values lie within half a code of the encoded ones, measured on the
// companded axis (sqrt(|m| / scale), (v / scale^2)^(1/4)).
TEST(Q8, DecodedValuesAreWithinHalfACode) {
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
    const double half = is_v ? 0.5 / 255 : 0.5 / 127;
    for (int64_t i = 0; i < n; ++i) {
      double s = scales[static_cast<size_t>(i / kQ8BlockElems)];
      double a = is_v ? std::sqrt(std::sqrt(x[i]) / s) : std::sqrt(std::fabs(x[i]) / s);
      double b = is_v ? std::sqrt(std::sqrt(back[i]) / s) : std::sqrt(std::fabs(back[i]) / s);
      if (is_v && codes[i] == 0) continue;  // code 0 decodes to half a step by design
      ASSERT_LE(std::fabs(a - b), half + 2e-6) << "element " << i << " = " << x[i];  // + fp32 rounding
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
