// The learning-rate schedule: its values at the points its formula names
// (warmup start and end, decay middle and end), both warmups, every decay,
// and the refusals.
#include "engine/lr_schedule.h"
#include "tests/tolerance.h"

#include <gtest/gtest.h>

#include <cmath>
#include <numbers>
#include <string>

namespace strata::engine {
namespace {

TEST(LrSchedule, TheDefaultIsThePeakThroughout) {
  for (int64_t step : {int64_t{1}, int64_t{2}, int64_t{1000}, int64_t{1} << 40}) EXPECT_EQ(lr_at(LrSchedule{}, 3e-3, step), 3e-3);
}

TEST(LrSchedule, WarmupsRiseFromTheStartToThePeak) {
  LrSchedule s;
  s.warmup_steps = 4;
  s.start_lr = 0.2;
  const double linear[] = {0.2, 0.4, 0.6, 0.8, 1.0, 1.0};  // i / 4 of the way, i = step - 1
  for (int64_t step = 1; step <= 6; ++step) EXPECT_DOUBLE_EQ(lr_at(s, 1.0, step), linear[step - 1]) << step;
  s.warmup = LrSchedule::Warmup::kLog;
  s.warmup_steps = 10;
  s.start_lr = 0;
  EXPECT_DOUBLE_EQ(lr_at(s, 1.0, 1), 0.0);                          // log(1) / log(10)
  EXPECT_DOUBLE_EQ(lr_at(s, 1.0, 4), std::log(4.0) / std::log(10.0));  // i = 3
  EXPECT_DOUBLE_EQ(lr_at(s, 1.0, 10), 1.0);                          // i = 9: log(10) / log(10)
  EXPECT_DOUBLE_EQ(lr_at(s, 1.0, 11), 1.0);
  double last = -1;
  for (int64_t step = 1; step <= 11; ++step) {
    EXPECT_GE(lr_at(s, 1.0, step), last) << step;
    last = lr_at(s, 1.0, step);
  }
}

TEST(LrSchedule, DecaysFallFromThePeakToTheEndAtTheirLastStep) {
  LrSchedule s;
  s.warmup_steps = 2;
  s.decay_end_step = 10;
  s.end_lr = 0.1;
  for (LrSchedule::Decay d : {LrSchedule::Decay::kLinear, LrSchedule::Decay::kCosine}) {
    SCOPED_TRACE(std::string(decay_name(d)));
    s.decay = d;
    ASSERT_TRUE(validate(s).ok());
    EXPECT_DOUBLE_EQ(lr_at(s, 1.0, 3), 1.0);    // i = 2 = W: the peak
    EXPECT_NEAR(lr_at(s, 1.0, 7), 0.55, strata::testing::kDoubleRoundoff);  // i = 6, half way: the middle, for both shapes
    EXPECT_NEAR(lr_at(s, 1.0, 11), 0.1, strata::testing::kDoubleRoundoff);  // i = 10 = T
    EXPECT_NEAR(lr_at(s, 1.0, 500), 0.1, strata::testing::kDoubleRoundoff);  // and after it
    double last = 2;
    for (int64_t step = 3; step <= 12; ++step) {
      EXPECT_LE(lr_at(s, 1.0, step), last) << step;
      last = lr_at(s, 1.0, step);
    }
  }
  s.decay = LrSchedule::Decay::kLinear;
  EXPECT_NEAR(lr_at(s, 1.0, 5), 0.1 + 0.9 * 6.0 / 8.0, strata::testing::kDoubleRoundoff);  // i = 4: (T - i) / (T - W)
  s.decay = LrSchedule::Decay::kCosine;
  EXPECT_NEAR(lr_at(s, 1.0, 5), 0.1 + 0.9 * (1 + std::cos(std::numbers::pi * 2.0 / 8.0)) / 2, strata::testing::kDoubleRoundoff);
}

TEST(LrSchedule, RefusesWhatHasNoMeaning) {
  LrSchedule s;
  s.warmup_steps = -1;
  EXPECT_EQ(validate(s).code(), StatusCode::kInvalidArgument);
  s = LrSchedule{};
  s.start_lr = -1e-3;
  EXPECT_EQ(validate(s).code(), StatusCode::kInvalidArgument);
  s = LrSchedule{};
  s.end_lr = NAN;
  EXPECT_EQ(validate(s).code(), StatusCode::kInvalidArgument);
  s = LrSchedule{};
  s.decay = LrSchedule::Decay::kCosine;
  s.warmup_steps = 100;
  s.decay_end_step = 100;
  Status st = validate(s);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("cosine decay must end (step 100) after the warmup (100 steps)"), std::string::npos)
      << st.to_string();
}

}  // namespace
}  // namespace strata::engine
