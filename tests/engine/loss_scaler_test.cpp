// LossScaler follows DeepSpeed's rules: halve after `hysteresis` overflows in
// a row (not below min_scale), double after `window` clean steps, and bad
// options or saved states are refused by name.
#include "engine/loss_scaler.h"

#include <gtest/gtest.h>

namespace strata::engine {
namespace {

TEST(LossScaler, HalvesAfterHysteresisAndDoublesAfterAWindow) {
  LossScaleOptions o;
  o.initial_power = 4;
  o.window = 3;
  o.hysteresis = 2;
  o.min_scale = 4;
  LossScaler s = std::move(LossScaler::create(o)).value();
  EXPECT_EQ(s.scale(), 16);
  s.update(true);  // the first overflow uses up the hysteresis
  EXPECT_EQ(s.scale(), 16);
  s.update(true);
  EXPECT_EQ(s.scale(), 8);
  s.update(true);
  EXPECT_EQ(s.scale(), 4);
  s.update(true);  // the floor
  EXPECT_EQ(s.scale(), 4);
  s.update(false);
  s.update(false);
  EXPECT_EQ(s.scale(), 4);
  s.update(false);
  EXPECT_EQ(s.scale(), 8);
  EXPECT_EQ(s.state().hysteresis_left, 2);  // growth restores the hysteresis
  s.update(false);
  s.update(true);  // an overflow restarts the window
  s.update(false);
  s.update(false);
  EXPECT_EQ(s.scale(), 8);
}

TEST(LossScaler, StateRoundTripsAndBadInputIsRefused) {
  LossScaleOptions o;
  LossScaler a = std::move(LossScaler::create(o)).value();
  a.update(true);
  a.update(true);
  a.update(false);
  LossScaler b = std::move(LossScaler::create(o)).value();
  ASSERT_TRUE(b.restore(a.state()).ok());
  EXPECT_EQ(b.scale(), a.scale());
  EXPECT_EQ(b.state().good_steps, 1);
  EXPECT_EQ(b.restore({3.0, 0, 1}).code(), StatusCode::kInvalidArgument);  // not a power of two
  EXPECT_EQ(b.restore({1024.0, 0, 5}).code(), StatusCode::kInvalidArgument);
  LossScaleOptions bad = o;
  bad.window = 0;
  Result<LossScaler> r = LossScaler::create(bad);
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message().find("window"), std::string::npos);
  bad = o;
  bad.min_scale = 3;
  EXPECT_FALSE(LossScaler::create(bad));
}

}  // namespace
}  // namespace strata::engine
