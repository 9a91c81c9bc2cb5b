#include "engine/access_schedule.h"

#include <gtest/gtest.h>

#include <vector>

namespace strata::engine {
namespace {

TEST(AccessSchedule, RecordsTheFirstStepAndPredictsTheNext) {
  AccessSchedule s;
  const std::vector<size_t> order = {1, 2, 3, 4, 4, 3, 2, 1};
  s.begin_step();
  for (size_t i = 0; i < order.size(); ++i) {
    AccessSchedule::Use u = s.use(order[i]);
    EXPECT_EQ(u.position, i);
    EXPECT_FALSE(u.predicted) << "nothing is known on the first step";
    EXPECT_FALSE(s.known(i + 1));
  }
  s.end_step();
  ASSERT_TRUE(s.replaying());
  EXPECT_EQ(s.order(), order);
  s.begin_step();
  for (size_t i = 0; i < order.size(); ++i) {
    ASSERT_TRUE(s.known(i));
    EXPECT_EQ(s.chunk_at(i), order[i]);
    EXPECT_TRUE(s.use(order[i]).predicted);
  }
  s.end_step();
  EXPECT_EQ(s.order(), order);
  EXPECT_EQ(s.deviations(), 0u);
}

TEST(AccessSchedule, ADeviationForgetsThePredictionAndRecordsAnew) {
  AccessSchedule s;
  s.set_order({1, 2, 3, 3, 2, 1});
  s.begin_step();
  EXPECT_TRUE(s.use(1).predicted);
  EXPECT_TRUE(s.use(2).predicted);
  AccessSchedule::Use u = s.use(5);  // the model took another path
  EXPECT_EQ(u.position, 2u);
  EXPECT_FALSE(u.predicted);
  EXPECT_FALSE(s.known(3)) << "nothing after a deviation is predicted";
  EXPECT_FALSE(s.use(5).predicted);
  EXPECT_FALSE(s.use(2).predicted);
  EXPECT_FALSE(s.use(1).predicted);
  s.end_step();
  EXPECT_EQ(s.order(), (std::vector<size_t>{1, 2, 5, 5, 2, 1}));
  EXPECT_EQ(s.deviations(), 1u);
  // A step longer than the recording deviates at its first extra use.
  s.begin_step();
  for (size_t c : {1, 2, 5, 5, 2, 1}) EXPECT_TRUE(s.use(c).predicted);
  EXPECT_FALSE(s.use(7).predicted);
  s.end_step();
  EXPECT_EQ(s.order(), (std::vector<size_t>{1, 2, 5, 5, 2, 1, 7}));
  EXPECT_EQ(s.deviations(), 2u);
}

}  // namespace
}  // namespace strata::engine
